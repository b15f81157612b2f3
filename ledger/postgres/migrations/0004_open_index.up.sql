-- 0004: a partial index of the open residuals (pending, unknown, accepted), so counting them
-- for metrics (OpenResiduals) reads the few open rows, never the whole table. Commits that
-- settle a residual change its state and so are no longer HOT updates.
-- Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_open ON toolfence_residuals (state, att_started)
    WHERE state IN ('pending', 'unknown', 'accepted');
