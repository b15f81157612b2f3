-- 0006 down: 0004's index of the open residuals comes back. Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_open ON toolfence_residuals (state, att_started)
    WHERE state IN ('pending', 'unknown', 'accepted');
