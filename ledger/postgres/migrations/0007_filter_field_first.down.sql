-- 0007 down: 0005's filter indexes, which lead with the namespace, come back. Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_task ON toolfence_residuals (namespace, task, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_operation ON toolfence_residuals (namespace, operation, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_target ON toolfence_residuals (namespace, target, key);
DROP INDEX IF EXISTS toolfence_residuals_by_task;
DROP INDEX IF EXISTS toolfence_residuals_by_operation;
DROP INDEX IF EXISTS toolfence_residuals_by_target;
