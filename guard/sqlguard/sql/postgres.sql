-- fence's guard inside PostgreSQL, version 1: fencing for writers in any
-- language (docs/protocol.md, "Guards inside the database"). Installed by
-- `fencectl guard install postgres://...` (or psql -f); running it again
-- replaces the functions and keeps the marks.
--
-- The marks live in sqlguard's table (Postgres dialect, DefaultTable), so
-- a Go sqlguard or pgxguard Store and these functions share each scope's
-- mark. The table and the functions go into the schema the installer's
-- search_path names first (current_schema()). Give the guard a schema of
-- its own, in which only its owner may create, and call the functions by
-- their qualified names with bigint arguments:
--   SELECT fence.fence_advance($1::text, $2::bigint, $3::bigint);
-- An unqualified call, or one with integer arguments, may find another
-- function of that name that a role with CREATE on a schema earlier in the
-- caller's search_path made. Each function runs with its search_path set
-- to its own schema (and pg_temp, last), so the table it reads and writes
-- is its schema's fence_tokens, whatever the caller's search_path.
BEGIN;
SET LOCAL client_min_messages = warning; -- not "relation already exists, skipping"

-- Two sessions replacing one function at once fail with "tuple
-- concurrently updated": installs wait for each other instead.
SELECT pg_advisory_xact_lock(hashtext('fence guard install'));

CREATE TABLE IF NOT EXISTS fence_tokens (scope varchar(256) PRIMARY KEY, token bigint NOT NULL, seq bigint NOT NULL);

-- fence_guard_version() is the version of these functions.
CREATE OR REPLACE FUNCTION fence_guard_version() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT 1';

-- fence_advance(scope, token, seq) checks a write against its scope's mark
-- and advances the mark, inside the caller's transaction: call it first,
-- then write, then commit. A stale token raises SQLSTATE FN409, which
-- aborts the transaction; a malformed argument raises FN400. seq 0 (the
-- default) means none: the write is ordered by its token alone.
--
-- The upsert is sqlguard's fence statement: resolving the conflict locks
-- the scope's row until the transaction ends, so other writers of the
-- scope wait here and then compare against the mark this one left.
CREATE OR REPLACE FUNCTION fence_advance(scope text, token bigint, seq bigint DEFAULT 0) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  highest bigint;
  highest_seq bigint;
BEGIN
  IF fence_advance.scope IS NULL OR octet_length(fence_advance.scope) > 256
      OR fence_advance.scope !~ '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$'
      OR fence_advance.scope ~ '(^|/)\.\.?(/|$)' THEN
    RAISE EXCEPTION 'fence_advance: % is not a scope', quote_nullable(fence_advance.scope)
      USING ERRCODE = 'FN400', HINT = '1 to 256 bytes of ASCII letters, digits, ".", "_", "-" and "/", as in docs/protocol.md.';
  END IF;
  IF fence_advance.token IS NULL OR fence_advance.token < 1 THEN
    RAISE EXCEPTION 'fence_advance: token % is outside 1 to 9223372036854775807', quote_nullable(fence_advance.token)
      USING ERRCODE = 'FN400';
  END IF;
  IF fence_advance.seq IS NULL OR fence_advance.seq < 0 THEN
    RAISE EXCEPTION 'fence_advance: sequence % is outside 0 to 9223372036854775807', quote_nullable(fence_advance.seq)
      USING ERRCODE = 'FN400';
  END IF;
  INSERT INTO fence_tokens AS f (scope, token, seq)
  VALUES (fence_advance.scope, fence_advance.token, fence_advance.seq)
  ON CONFLICT (scope) DO UPDATE SET token = excluded.token,
    seq = CASE WHEN excluded.token > f.token THEN excluded.seq ELSE GREATEST(f.seq, excluded.seq) END
  WHERE excluded.token > f.token OR excluded.token = f.token AND (excluded.seq = 0 OR excluded.seq >= f.seq);
  IF FOUND THEN
    RETURN;
  END IF;
  SELECT f.token, f.seq INTO highest, highest_seq FROM fence_tokens f WHERE f.scope = fence_advance.scope;
  RAISE EXCEPTION 'stale fencing token for "%": %', fence_advance.scope,
      CASE WHEN fence_advance.token < highest
        THEN format('token %s was superseded by token %s', fence_advance.token, highest)
        ELSE format('sequence %s of token %s was superseded by sequence %s', fence_advance.seq, highest, highest_seq) END
    USING ERRCODE = 'FN409',
      DETAIL = format('scope=%s presented_token=%s highest_token=%s presented_seq=%s highest_seq=%s',
        fence_advance.scope, fence_advance.token, highest, fence_advance.seq, highest_seq),
      HINT = 'The lease is lost: stop, and do not retry with this token.';
END
$$;

-- fence_row_token() is a trigger function for a table whose rows carry the
-- token of their last write in a column fence_token bigint, as
-- sqlguard.UpdateRow writes them. Attached with
--   CREATE TRIGGER orders_fence BEFORE INSERT OR UPDATE OR DELETE ON orders
--     FOR EACH ROW EXECUTE FUNCTION fence.fence_row_token('orders');
-- it refuses (FN409) an update that lowers a row's fence_token, and (FN400)
-- one that sets it to NULL. Its argument is the scope (default: the
-- table's name). A BEFORE ROW trigger sees the row as locked by the
-- update, so concurrent writers compare against each other's committed
-- tokens. An update that leaves fence_token alone passes: every writer
-- must set it.
--
-- A delete carries no new row, so the deleter presents its token in the
-- setting fence.token of its transaction (SET LOCAL fence.token = '42'):
-- without one the delete is refused (FN400), with one lower than the row's
-- (FN409). An accepted delete advances the scope's mark (fence_advance),
-- which stays as the row's tombstone: an insert whose fence_token is
-- lower than the scope's mark is refused (FN409), so a stale
-- holder cannot delete a row and insert it again with its older token.
-- Attached BEFORE UPDATE only, as in version 1, it fences updates alone.
CREATE OR REPLACE FUNCTION fence_row_token() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_scope text := coalesce(TG_ARGV[0], TG_TABLE_NAME);
  presented text;
  deleter bigint;
  highest bigint;
BEGIN
  IF TG_OP = 'DELETE' THEN
    presented := nullif(current_setting('fence.token', true), '');
    IF presented IS NULL OR presented !~ '^[0-9]{1,19}$' THEN
      RAISE EXCEPTION 'fence_row_token: a delete from % must present its token: SET LOCAL fence.token = ''TOKEN''', TG_TABLE_NAME
        USING ERRCODE = 'FN400', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    deleter := presented::numeric; -- a value above 2^63-1 fails here
    IF deleter < OLD.fence_token THEN
      RAISE EXCEPTION 'stale fencing token for "%": token % was superseded by token %', v_scope, deleter, OLD.fence_token
        USING ERRCODE = 'FN409',
          DETAIL = format('scope=%s presented_token=%s highest_token=%s', v_scope, deleter, OLD.fence_token),
          HINT = 'The lease is lost: stop, and do not retry with this token.',
          TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, COLUMN = 'fence_token';
    END IF;
    PERFORM fence_advance(v_scope, deleter);
    RETURN OLD;
  END IF;
  IF NEW.fence_token IS NULL THEN
    RAISE EXCEPTION 'fence_row_token: % sets fence_token to NULL', TG_TABLE_NAME
      USING ERRCODE = 'FN400', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, COLUMN = 'fence_token';
  END IF;
  IF TG_OP = 'INSERT' THEN
    -- The scope's mark is made (at 0, which no token is below) if it is
    -- new, waiting for a delete that is making it; FOR SHARE waits for a
    -- delete of this scope under way, and reads the mark it left.
    INSERT INTO fence_tokens (scope, token, seq) VALUES (v_scope, 0, 0) ON CONFLICT (scope) DO NOTHING;
    SELECT f.token INTO highest FROM fence_tokens f WHERE f.scope = v_scope FOR SHARE;
    IF NEW.fence_token < highest THEN
      RAISE EXCEPTION 'stale fencing token for "%": token % was superseded by token %', v_scope, NEW.fence_token, highest
        USING ERRCODE = 'FN409',
          DETAIL = format('scope=%s presented_token=%s highest_token=%s', v_scope, NEW.fence_token, highest),
          HINT = 'The lease is lost: stop, and do not retry with this token.',
          TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, COLUMN = 'fence_token';
    END IF;
    RETURN NEW;
  END IF;
  IF NEW.fence_token < OLD.fence_token THEN
    RAISE EXCEPTION 'stale fencing token for "%": token % was superseded by token %',
        v_scope, NEW.fence_token, OLD.fence_token
      USING ERRCODE = 'FN409',
        DETAIL = format('scope=%s presented_token=%s highest_token=%s', v_scope, NEW.fence_token, OLD.fence_token),
        HINT = 'The lease is lost: stop, and do not retry with this token.',
        TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, COLUMN = 'fence_token';
  END IF;
  RETURN NEW;
END
$$;

-- Each function finds its table in its own schema, whatever the caller's
-- search_path; pg_temp last, so that no temporary table shadows it.
DO $$
DECLARE
  fn text;
BEGIN
  FOREACH fn IN ARRAY ARRAY['fence_advance(text, bigint, bigint)', 'fence_row_token()', 'fence_guard_version()'] LOOP
    EXECUTE format('ALTER FUNCTION %I.%s SET search_path = %I, pg_temp', current_schema(), fn, current_schema());
  END LOOP;
END
$$;

COMMIT;
