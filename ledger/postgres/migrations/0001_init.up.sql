-- 0001: residuals, the per-resource fencing-token counter and change notifications.
-- Idempotent: every statement may run again over a schema that already has it.

-- Fencing tokens per (namespace, key). Rows are only inserted or raised, never deleted or
-- lowered (GC leaves them), so a key reserved again after GC gets a higher token.
CREATE TABLE IF NOT EXISTS toolfence_tokens (
    namespace text   NOT NULL,
    key       text   NOT NULL,
    token     bigint NOT NULL CHECK (token > 0),
    PRIMARY KEY (namespace, key)
);

-- One row per residual. The current (last) attempt lives in att_* columns so that fences are
-- plain column comparisons; earlier attempts, evidence and resolutions are JSONB arrays.
CREATE TABLE IF NOT EXISTS toolfence_residuals (
    namespace           text        NOT NULL,
    key                 text        NOT NULL,
    task                text        NOT NULL,
    operation           text        NOT NULL,
    target              text        NOT NULL,
    state               text        NOT NULL
        CHECK (state IN ('pending', 'unknown', 'accepted', 'succeeded', 'failed')),
    request_digest      text        NOT NULL,
    token               bigint      NOT NULL,
    att_n               integer     NOT NULL,
    att_holder          text        NOT NULL,
    att_token           bigint      NOT NULL,
    att_lease_expires   timestamptz NOT NULL,
    att_started         timestamptz NOT NULL,
    att_ended           timestamptz,
    att_request_digest  text        NOT NULL,
    att_response_digest text        NOT NULL DEFAULT '',
    att_outcome         text        NOT NULL DEFAULT '',
    att_error           text        NOT NULL DEFAULT '',
    att_released        boolean     NOT NULL DEFAULT false,
    -- att_reservation identifies the Reserve call that created the attempt, so a Reserve
    -- whose connection broke can tell whether its own insert landed.
    att_reservation     text        NOT NULL DEFAULT '',
    prior_attempts      jsonb       NOT NULL DEFAULT '[]',
    result              bytea,
    result_digest       text        NOT NULL DEFAULT '',
    result_truncated    boolean     NOT NULL DEFAULT false,
    handle              text        NOT NULL DEFAULT '',
    evidence            jsonb       NOT NULL DEFAULT '[]',
    resolutions         jsonb       NOT NULL DEFAULT '[]',
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 80);
-- No index besides the primary key: commits and renewals change no indexed column, so with
-- room left on each page (fillfactor) they are HOT updates that touch no index. GC scans.

-- Raised by the one-statement Reserve when the token counter moved under it (a GC racing a
-- re-reservation): the statement rolls back and the client tries again.
CREATE OR REPLACE FUNCTION toolfence_check_token(want bigint, got bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF want IS DISTINCT FROM got THEN
        RAISE EXCEPTION 'toolfence: token counter moved (% != %)', want, got USING ERRCODE = 'TF409';
    END IF;
    RETURN got;
END
$$;

-- Sessions that LISTEN for changes register here (their backend pid) while they listen.
-- Every residual write notifies the schema's channel in its own transaction while a
-- watcher is registered; NOTIFY serialises the commits of every notifying transaction of
-- the cluster, so nobody pays for it while nobody listens.
CREATE TABLE IF NOT EXISTS toolfence_watchers (
    pid   integer     PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);
