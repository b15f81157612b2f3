-- 0002: the fencing-token counter moves into the residual row. GC no longer deletes a
-- residual: it replaces it by a tombstone (state 'collected') that keeps only the key and its
-- token, so a key reserved again after GC continues from that token. Reserve then writes one
-- row of one table instead of two, and toolfence_tokens goes away.
-- Idempotent: every statement may run again over a schema that already has it.

ALTER TABLE toolfence_residuals DROP CONSTRAINT IF EXISTS toolfence_residuals_state_check;
ALTER TABLE toolfence_residuals ADD CONSTRAINT toolfence_residuals_state_check
    CHECK (state IN ('pending', 'unknown', 'accepted', 'succeeded', 'failed', 'collected'));

DO $$
BEGIN
    IF to_regclass('toolfence_tokens') IS NOT NULL THEN
        -- Keys collected under 0001 kept only their counter: they become tombstones.
        INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state,
            request_digest, token, att_n, att_holder, att_token, att_lease_expires, att_started,
            att_request_digest, created_at, updated_at)
        SELECT t.namespace, t.key, '', '', '', 'collected', '', t.token, 0, '', t.token,
            now(), now(), '', now(), now()
        FROM toolfence_tokens t
        WHERE NOT EXISTS (SELECT 1 FROM toolfence_residuals r WHERE r.namespace = t.namespace AND r.key = t.key)
        ON CONFLICT (namespace, key) DO NOTHING;
        -- Under 0001 a residual's token equals its counter; should one be behind, its next
        -- token must still exceed every token the counter issued. Only rows whose attempt is
        -- over are raised, so no live holder's token changes.
        UPDATE toolfence_residuals r SET token = t.token
        FROM toolfence_tokens t
        WHERE r.namespace = t.namespace AND r.key = t.key AND r.token < t.token
            AND (r.att_released OR r.att_outcome <> '');
        DROP TABLE toolfence_tokens;
    END IF;
END
$$;

DROP FUNCTION IF EXISTS toolfence_check_token(bigint, bigint);
