-- 0007: the three filter indexes lead with their field: (task, namespace, key) instead of
-- 0005's (namespace, task, key), and likewise for operation and target.
--
-- Why: 0005's indexes begin with the primary key's first column, so a lookup by
-- (namespace, key) could use one of them with the key as a condition on its third column,
-- which reads every entry of the namespace. PostgreSQL chose exactly that when it made a
-- statement's generic plan while the table was small (the ledger's sessions run generic
-- plans from the first call): on a freshly migrated schema Get, the other reads by key and
-- the locking paths' write used toolfence_residuals_target, and a connection keeps its
-- generic plan until the table's statistics change, which without autovacuum is never, so
-- each of those calls read the whole namespace. An index whose first column the lookup does
-- not constrain can only be read in full on PostgreSQL 15, which the planner does not
-- prefer to the primary key (TestKeyLookupsReadOneRowOnANewTable). Filtered listings are
-- unchanged: field = $, namespace = $ and key > $ in key order are still one range scan of
-- the field's index.
--
-- Built in the migration's transaction: the new indexes lock out writers while they build
-- (about 0.1 s per 20,000 residuals each on the development machine). Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_by_task ON toolfence_residuals (task, namespace, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_by_operation ON toolfence_residuals (operation, namespace, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_by_target ON toolfence_residuals (target, namespace, key);
-- The old indexes are dropped in the table's own schema, named with it: unqualified, a run
-- again under a search_path of several schemas would drop the next schema's.
DO $$
DECLARE
    home text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = 'toolfence_residuals'::regclass);
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS %1$I.toolfence_residuals_task, %1$I.toolfence_residuals_operation, '
        '%1$I.toolfence_residuals_target', home);
END
$$;
