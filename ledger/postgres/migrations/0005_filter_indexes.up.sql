-- 0005: indexes for what List filters on, so a filtered listing (list_pending with a task,
-- operation or target, and the open states it always asks for) is an index range scan in key
-- order that reads only matching rows, never the whole namespace (issue 14: a filter that
-- matched nothing read all of 23,000 residuals).
--
-- Task, operation and target are fixed when a residual is created (its key derives from
-- them); only Reserve's insert and GC's tombstone write them. Commits, renewals and evidence
-- leave them alone, so these indexes cost no HOT update: renewals and evidence stay HOT.
-- The open index keys on state, which 0004 already indexes, so the commits that settle a
-- residual were already non-HOT. The trade-off: a non-HOT update (a settle, a resolve, a
-- reserve of a failed key) and an insert now add one entry to each of these four indexes
-- too (docs/benchmarks.md has the cost), and each index takes disk space (about the size
-- of its column plus the key per residual).
--
-- Built in the migration's transaction: CREATE INDEX holds a lock that blocks writes to
-- toolfence_residuals while it builds (about 0.1 s per 20,000 residuals on the development
-- machine). Idempotent.
CREATE INDEX IF NOT EXISTS toolfence_residuals_task ON toolfence_residuals (namespace, task, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_operation ON toolfence_residuals (namespace, operation, key);
CREATE INDEX IF NOT EXISTS toolfence_residuals_target ON toolfence_residuals (namespace, target, key);
-- The open residuals of a namespace in key order: list_pending without a field filter reads
-- only those, however many settled residuals the namespace holds.
CREATE INDEX IF NOT EXISTS toolfence_residuals_open_key ON toolfence_residuals (namespace, key)
    WHERE state IN ('pending', 'unknown', 'accepted');
