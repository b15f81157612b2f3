-- 0002 down: the token counters move back into toolfence_tokens (one row per key ever
-- reserved, tombstones included), then the tombstones are deleted. Stop every process of a
-- toolfence that knows version 2 first: they would reserve collected keys from token 1.
-- Idempotent.

-- No writer may change a residual between the copy of the tokens and the end.
LOCK TABLE toolfence_residuals IN EXCLUSIVE MODE;

DROP TRIGGER IF EXISTS toolfence_no_delete ON toolfence_residuals;
DROP FUNCTION IF EXISTS toolfence_refuse_delete();

CREATE TABLE IF NOT EXISTS toolfence_tokens (
    namespace text   NOT NULL,
    key       text   NOT NULL,
    token     bigint NOT NULL CHECK (token > 0),
    PRIMARY KEY (namespace, key)
);

INSERT INTO toolfence_tokens AS k (namespace, key, token)
SELECT namespace, key, token FROM toolfence_residuals WHERE token > 0
ON CONFLICT (namespace, key) DO UPDATE SET token = greatest(k.token, EXCLUDED.token);

DELETE FROM toolfence_residuals WHERE state = 'collected';

ALTER TABLE toolfence_residuals DROP CONSTRAINT IF EXISTS toolfence_residuals_state_check;
ALTER TABLE toolfence_residuals ADD CONSTRAINT toolfence_residuals_state_check
    CHECK (state IN ('pending', 'unknown', 'accepted', 'succeeded', 'failed'));

CREATE OR REPLACE FUNCTION toolfence_check_token(want bigint, got bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF want IS DISTINCT FROM got THEN
        RAISE EXCEPTION 'toolfence: token counter moved (% != %)', want, got USING ERRCODE = 'TF409';
    END IF;
    RETURN got;
END
$$;
