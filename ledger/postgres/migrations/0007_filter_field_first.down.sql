-- 0007 down: 0005's filter indexes, which lead with the namespace, come back and 0007's go
-- (dropped in the table's own schema, as in the up SQL). Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_task ON toolfence_residuals (namespace, task, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_operation ON toolfence_residuals (namespace, operation, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_target ON toolfence_residuals (namespace, target, key);
DO $$
DECLARE
    home text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = 'toolfence_residuals'::regclass);
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS %1$I.toolfence_residuals_by_task, %1$I.toolfence_residuals_by_operation, '
        '%1$I.toolfence_residuals_by_target', home);
END
$$;
