-- 0004 down: the open-residual index goes. Idempotent.
DROP INDEX IF EXISTS toolfence_residuals_open;
