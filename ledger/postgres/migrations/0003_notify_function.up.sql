-- 0003: the change notification of a write is one function call. Every write's RETURNING
-- list notifies watchers while one is registered; with the payload built here instead of
-- inline, a write that nobody watches prepares a single call rather than the whole payload
-- expression. Idempotent.
CREATE OR REPLACE FUNCTION toolfence_notify(ns text, k text, s text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(left('toolfence:' || current_schema(), 63),
        CASE WHEN octet_length(ns) < 7000 THEN json_build_object('n', ns, 'k', k, 's', s)::text
        ELSE json_build_object('k', k, 's', s)::text END);
    RETURN true;
END
$$;
