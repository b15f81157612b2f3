-- 0002: the fencing-token counter moves into the residual row. GC no longer deletes a
-- residual: it replaces it by a tombstone (state 'collected') that keeps only the key and its
-- token, so a key reserved again after GC continues from that token. Reserve then writes one
-- row of one table instead of two, and toolfence_tokens goes away.
--
-- Stop every process of an older toolfence before running it: an older process's reserves
-- fail (fail closed) once toolfence_tokens is gone, and its reads would show tombstones.
-- Idempotent: every statement may run again over a schema that already has it. The objects
-- of 0001 it converts are looked up in the schema of the toolfence_residuals it migrates,
-- never elsewhere on the search_path.

-- The state CHECK goes: PostgreSQL prepares a CHECK expression anew for every INSERT and
-- UPDATE, which cost about 7 % of a guarded call's throughput at 64 callers (measured, see
-- docs/benchmarks.md). The ledger writes only the states of its own rules and refuses any
-- other before it writes (writeArgs); the primary key stays the final safety net.
ALTER TABLE toolfence_residuals DROP CONSTRAINT IF EXISTS toolfence_residuals_state_check;

-- A residual row is never deleted from now on (a tombstone holds its key's last token): a
-- GC of an older toolfence that still deletes would let a key's token start again at 1.
CREATE OR REPLACE FUNCTION toolfence_refuse_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'toolfence: residual rows are never deleted since schema version 2 (GC leaves a tombstone); upgrade toolfence'
        USING ERRCODE = 'TF403';
END
$$;
DROP TRIGGER IF EXISTS toolfence_no_delete ON toolfence_residuals;
CREATE TRIGGER toolfence_no_delete BEFORE DELETE ON toolfence_residuals
    FOR EACH ROW EXECUTE FUNCTION toolfence_refuse_delete();

DO $$
DECLARE
    home text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = 'toolfence_residuals'::regclass);
    tokens text := format('%I.toolfence_tokens', home);
BEGIN
    IF to_regclass(tokens) IS NOT NULL THEN
        -- Keys collected under 0001 kept only their counter: they become tombstones.
        EXECUTE format($q$
            INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state,
                request_digest, token, att_n, att_holder, att_token, att_lease_expires, att_started,
                att_request_digest, created_at, updated_at)
            SELECT t.namespace, t.key, '', '', '', 'collected', '', t.token, 0, '', t.token,
                now(), now(), '', now(), now()
            FROM %s t
            WHERE NOT EXISTS (SELECT 1 FROM toolfence_residuals r WHERE r.namespace = t.namespace AND r.key = t.key)
            ON CONFLICT (namespace, key) DO NOTHING$q$, tokens);
        -- Under 0001 a residual's token equals its counter; should one be behind, its next
        -- token must still exceed every token the counter issued. Only rows whose attempt is
        -- over are raised, so no live holder's token changes.
        EXECUTE format($q$
            UPDATE toolfence_residuals r SET token = t.token
            FROM %s t
            WHERE r.namespace = t.namespace AND r.key = t.key AND r.token < t.token
                AND (r.att_released OR r.att_outcome <> '')$q$, tokens);
        EXECUTE format('DROP TABLE %s', tokens);
    END IF;
    IF to_regprocedure(format('%I.toolfence_check_token(bigint, bigint)', home)) IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION %I.toolfence_check_token(bigint, bigint)', home);
    END IF;
END
$$;
