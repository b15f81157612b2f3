-- 0005 down: the filter indexes go; List scans the namespace again. Idempotent.
DROP INDEX IF EXISTS toolfence_residuals_open_key;
DROP INDEX IF EXISTS toolfence_residuals_target;
DROP INDEX IF EXISTS toolfence_residuals_operation;
DROP INDEX IF EXISTS toolfence_residuals_task;
