-- 0001 down: drops every toolfence object of this schema, with its data. Idempotent.
DROP TABLE IF EXISTS toolfence_residuals;
DROP TABLE IF EXISTS toolfence_tokens;
DROP TABLE IF EXISTS toolfence_watchers;
DROP FUNCTION IF EXISTS toolfence_check_token(bigint, bigint);
