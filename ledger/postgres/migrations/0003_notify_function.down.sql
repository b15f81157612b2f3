-- 0003 down: the notification function goes (versions up to 2 build the payload inline).
-- Idempotent.
DROP FUNCTION IF EXISTS toolfence_notify(text, text, text);
