-- fence's guard inside MySQL and MariaDB, version 1: fencing for writers
-- in any language (docs/protocol.md, "Guards inside the database").
-- Installed by `fencectl guard install mysql://...` (or the mysql client,
-- which understands the DELIMITER lines); running it again replaces the
-- routines and keeps the marks. Routines cannot be replaced in place on
-- MySQL, so for a moment during a reinstall a call may find none: it fails,
-- and writes nothing.
--
-- The marks live in sqlguard's table (MySQL dialect, DefaultTable), in the
-- current database, so a Go sqlguard Store and these routines share each
-- scope's mark.
--
-- Arguments are converted to the parameters' types under the caller's
-- sql_mode, which, if not strict, clamps an out-of-range number and cuts an
-- oversized string without an error. So the parameters are wider than the
-- columns, and fence_advance refuses what does not fit them: 2^63, clamped
-- to BIGINT, would pass for the highest token, 2^63-1.

-- Installs wait for each other: two at once could both drop a routine and
-- then both create it, and the second would fail.
SELECT GET_LOCK('fence guard install', 60) INTO @fence_install_locked;

CREATE TABLE IF NOT EXISTS fence_tokens (scope VARBINARY(256) PRIMARY KEY, token BIGINT NOT NULL, seq BIGINT NOT NULL) ENGINE=InnoDB;

-- fence_guard_version() is the version of these routines.
DROP FUNCTION IF EXISTS fence_guard_version;
CREATE FUNCTION fence_guard_version() RETURNS INT DETERMINISTIC RETURN 1;

DROP PROCEDURE IF EXISTS fence_advance;
DROP PROCEDURE IF EXISTS fence_row_token;
DROP PROCEDURE IF EXISTS fence_row_insert;
DROP PROCEDURE IF EXISTS fence_row_delete;

DELIMITER //

-- fence_advance(scope, token, seq) checks a write against its scope's mark
-- and advances the mark, inside the caller's transaction: START
-- TRANSACTION, CALL it, write, COMMIT. A stale token signals SQLSTATE
-- FN409 and a malformed argument FN400; MySQL does not roll back on an
-- error, so the caller must (the mysql client, without --force, stops at
-- the error, and the server rolls back when it disconnects). seq 0 means
-- none: the write is ordered by its token alone.
--
-- The insert makes the scope's row if it is new; the locking read then
-- holds the row, and reads its newest committed version whatever the
-- isolation level, until the transaction ends, so other writers of the
-- scope wait here and then compare against the mark this one left.
CREATE PROCEDURE fence_advance(IN p_scope VARBINARY(1024), IN p_token DECIMAL(65,30), IN p_seq DECIMAL(65,30))
MODIFIES SQL DATA
BEGIN
  DECLARE t, s, v_token, v_seq BIGINT;
  DECLARE v_msg VARCHAR(128);
  -- The first REGEXP refuses every other byte: the second alone would pass
  -- a scope ending in a newline, since '$' also matches before a final
  -- newline (MariaDB's PCRE, MySQL's ICU).
  IF p_scope IS NULL OR LENGTH(p_scope) > 256
      OR CONVERT(p_scope USING ascii) COLLATE ascii_bin REGEXP '[^A-Za-z0-9._/-]'
      OR CONVERT(p_scope USING ascii) COLLATE ascii_bin NOT REGEXP '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$'
      OR CONVERT(p_scope USING ascii) COLLATE ascii_bin REGEXP '(^|/)[.][.]?(/|$)' THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_advance: not a scope: want 1 to 256 bytes of ASCII letters, digits, ".", "_", "-" and "/"';
  END IF;
  IF p_token IS NULL OR p_token < 1 OR p_token > 9223372036854775807 OR p_token <> FLOOR(p_token) THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_advance: the token is not an integer from 1 to 9223372036854775807';
  END IF;
  IF p_seq IS NULL OR p_seq < 0 OR p_seq > 9223372036854775807 OR p_seq <> FLOOR(p_seq) THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_advance: the sequence is not an integer from 0 to 9223372036854775807';
  END IF;
  SET t = p_token, s = p_seq;
  INSERT INTO fence_tokens (scope, token, seq) VALUES (p_scope, t, s)
    ON DUPLICATE KEY UPDATE token = token;
  SELECT token, seq INTO v_token, v_seq FROM fence_tokens WHERE scope = p_scope FOR UPDATE;
  IF t < v_token OR t = v_token AND s <> 0 AND s < v_seq THEN
    -- MySQL keeps 128 characters of a message: the scope, which the
    -- caller knows, goes last.
    SET v_msg = LEFT(CONCAT('stale fencing token: presented_token=', t, ' highest_token=', v_token,
      ' presented_seq=', s, ' highest_seq=', v_seq, ' scope=', p_scope), 128);
    SIGNAL SQLSTATE 'FN409' SET MESSAGE_TEXT = v_msg;
  END IF;
  UPDATE fence_tokens SET seq = IF(t > token, s, GREATEST(seq, s)), token = GREATEST(token, t)
    WHERE scope = p_scope;
END//

-- fence_row_token(scope, old, new) refuses (FN409) a row update that lowers
-- the row's fence_token, and (FN400) one that sets it to NULL: for a table
-- whose rows carry the token of their last write, as sqlguard.UpdateRow
-- writes them. Call it from a trigger of the table:
--   CREATE TRIGGER orders_fence BEFORE UPDATE ON orders FOR EACH ROW
--     CALL fence_row_token('orders', OLD.fence_token, NEW.fence_token);
-- scope only names the scope in the error. An update that leaves
-- fence_token alone passes: every writer must set it.
CREATE PROCEDURE fence_row_token(IN p_scope VARBINARY(1024), IN p_old BIGINT, IN p_new BIGINT)
NO SQL
BEGIN
  DECLARE v_msg VARCHAR(128);
  IF p_new IS NULL THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_row_token: the update sets fence_token to NULL';
  END IF;
  IF p_new < p_old THEN
    SET v_msg = LEFT(CONCAT('stale fencing token: presented_token=', p_new, ' highest_token=', p_old,
      ' scope=', p_scope), 128);
    SIGNAL SQLSTATE 'FN409' SET MESSAGE_TEXT = v_msg;
  END IF;
END//

-- fence_row_insert(scope, new) and fence_row_delete(scope, old) fence the
-- inserts and deletes of such a table, so that a stale holder cannot
-- delete a row and insert it again with its older token:
--   CREATE TRIGGER orders_fence_insert BEFORE INSERT ON orders FOR EACH ROW
--     CALL fence_row_insert('orders', NEW.fence_token);
--   CREATE TRIGGER orders_fence_delete BEFORE DELETE ON orders FOR EACH ROW
--     CALL fence_row_delete('orders', OLD.fence_token);
-- Here scope is the scope whose mark they keep. A delete carries no new
-- row, so the deleter presents its token in the session variable
-- @fence_token, set just before the DELETE (and set to NULL after it, on a
-- connection that others use next): without it the delete is refused
-- (FN400), with one lower than the row's (FN409). An accepted delete
-- advances the scope's mark (fence_advance), which stays as the row's
-- tombstone: an insert whose fence_token is lower than the mark is refused
-- (FN409).
CREATE PROCEDURE fence_row_delete(IN p_scope VARBINARY(1024), IN p_old BIGINT)
MODIFIES SQL DATA
BEGIN
  DECLARE v_token DECIMAL(65,30);
  DECLARE v_msg VARCHAR(128);
  SET v_token = @fence_token;
  IF v_token IS NULL OR v_token < 1 OR v_token > 9223372036854775807 OR v_token <> FLOOR(v_token) THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_row_delete: a delete must present its token, 1 to 9223372036854775807: SET @fence_token = TOKEN';
  END IF;
  IF v_token < p_old THEN
    SET v_msg = LEFT(CONCAT('stale fencing token: presented_token=', CAST(v_token AS UNSIGNED), ' highest_token=', p_old,
      ' scope=', p_scope), 128);
    SIGNAL SQLSTATE 'FN409' SET MESSAGE_TEXT = v_msg;
  END IF;
  CALL fence_advance(p_scope, v_token, 0);
END//

CREATE PROCEDURE fence_row_insert(IN p_scope VARBINARY(1024), IN p_new BIGINT)
MODIFIES SQL DATA
BEGIN
  DECLARE v_token BIGINT;
  DECLARE v_msg VARCHAR(128);
  IF p_new IS NULL THEN
    SIGNAL SQLSTATE 'FN400' SET MESSAGE_TEXT = 'fence_row_insert: the insert sets fence_token to NULL';
  END IF;
  -- The locking read waits for a delete of this scope under way, and
  -- reads the mark it left; the insert before it makes the scope's mark
  -- (at 0, which no token is below) if it is new, waiting for a delete
  -- that is making it.
  INSERT INTO fence_tokens (scope, token, seq) VALUES (p_scope, 0, 0) ON DUPLICATE KEY UPDATE token = token;
  SELECT token INTO v_token FROM fence_tokens WHERE scope = p_scope LOCK IN SHARE MODE;
  IF p_new < v_token THEN
    SET v_msg = LEFT(CONCAT('stale fencing token: presented_token=', p_new, ' highest_token=', v_token,
      ' scope=', p_scope), 128);
    SIGNAL SQLSTATE 'FN409' SET MESSAGE_TEXT = v_msg;
  END IF;
END//

DELIMITER ;

DO RELEASE_LOCK('fence guard install');
