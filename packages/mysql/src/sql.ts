import { IdempotencyOptionsError } from '@oncely/core';

/**
 * Every statement of the store, built once per store from its (validated, quoted) table name. Times are epoch
 * milliseconds in BIGINT columns, all read from the database's clock in SQL: `UTC_TIMESTAMP(6)`, so that neither
 * the session's time zone nor a daylight-saving change moves them, and constant within one statement (MySQL and
 * MariaDB fix it at the statement's start), so the tests of one statement agree.
 */

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;

export function checkIdentifier(option: string, value: string): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new IdempotencyOptionsError(
      option,
      `must be a plain SQL identifier (letters, digits, _; at most 64); got ${JSON.stringify(value)}.`,
      'oncely/mysql',
    );
  }
  return value;
}

/** Now, in epoch milliseconds, from the server's clock. */
export const NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";

/**
 * What the acquire statement reports in its OK packet's insert id (`LAST_INSERT_ID(n)` sets it; the table has no
 * AUTO_INCREMENT column, so it is 0 when no branch called it): MySQL has no RETURNING, and mysql2 sets
 * CLIENT_FOUND_ROWS, so affected rows cannot tell "inserted" from "left as it was".
 */
export const ACQUIRE_MARK = { acquired: 0, held: 1, resumed: 2 } as const;

/** The CREATE TABLE of the records table, also shown in the docs. */
export function createTable(table: string): string {
  return `CREATE TABLE IF NOT EXISTS \`${table}\` (
  \`key\` VARBINARY(3072) NOT NULL,
  fingerprint TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  state ENUM('in_progress', 'completed') NOT NULL,
  token CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  lock_expires_at BIGINT NULL,
  status SMALLINT NULL,
  headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  body LONGBLOB NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  steps LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  keep_until BIGINT NULL,
  PRIMARY KEY (\`key\`),
  KEY \`${table}_expires_at_idx\` (expires_at)
) ENGINE = InnoDB`;
}

/**
 * A live record: completed within its TTL, in progress within its lease, or released (it carries steps, its lease
 * ended, and it is within keep_until). A condition on the records table's columns.
 */
const LIVE = `expires_at > ${NOW_MS} AND (state = 'completed' OR steps IS NOT NULL OR lock_expires_at > ${NOW_MS})`;

/** A record whose owner holds a live lease. */
const HELD = `state = 'in_progress' AND lock_expires_at > ${NOW_MS}`;

/**
 * The columns `toRecord` decodes, `body` being the expression the body is read with. `released` is derived: a
 * record with steps whose lease ended. Steps are shown only while the record is in progress.
 */
function recordColumns(body: string): string {
  return `state, fingerprint, token, COALESCE(lock_expires_at, 0) AS lock_ms, expires_at AS expires_ms,
    status, headers, ${body} AS body, IF(state = 'in_progress', steps, NULL) AS steps,
    (state = 'in_progress' AND lock_expires_at <= ${NOW_MS}) AS released`;
}

/** The records table the store uses when it is given no `table`. */
export const DEFAULT_TABLE = 'oncely_idempotency';

/**
 * How the records table is laid out, for a tool that reads records without going through a store (the `oncely`
 * command): the table, its key column, the SQL conditions of a live and of a held record, and the columns a row
 * is read with for `decodeRecord`. Conditions and columns name the table's columns unqualified.
 */
export interface RecordsLayout {
  /** The records table, quoted (in the connection's database). */
  table: string;
  /** Its name, unquoted (as information_schema has it). */
  tableName: string;
  /** The primary key column (VARBINARY: the store key's UTF-8 bytes), quoted. */
  key: string;
  /** True of a live record (completed within its TTL, in progress within its lease, or released). */
  live: string;
  /** True of a record whose lease is held now. */
  held: string;
  /** A live record's state (text: 'in_progress', 'completed' or 'released'); NULL for a dead one. */
  state: string;
  /**
   * The columns `decodeRecord` reads: the key, the record, its creation time and the database's clock. With
   * `bodyBytes`, the body is read up to that many bytes (its full length is still decoded).
   */
  columns(options?: { bodyBytes?: number }): string;
}

/** The layout of the records table `MySQLStore` keeps with this `table` option. */
export function recordsLayout(options: { table?: string } = {}): RecordsLayout {
  const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE);
  return {
    table: `\`${table}\``,
    tableName: table,
    key: '`key`',
    live: LIVE,
    held: HELD,
    state: `CASE WHEN (${LIVE}) IS NOT TRUE THEN NULL WHEN state = 'completed' THEN 'completed'
      WHEN lock_expires_at > ${NOW_MS} THEN 'in_progress' ELSE 'released' END`,
    columns: ({ bodyBytes } = {}) => {
      const body =
        bodyBytes === undefined ? 'body' : `SUBSTRING(body, 1, ${Math.max(0, Math.trunc(bodyBytes))})`;
      return `\`key\`, ${recordColumns(body)}, LENGTH(body) AS body_length, created_at AS created_ms, ${NOW_MS} AS now_ms`;
    },
  };
}

export function statements(table: string) {
  const t = `\`${table}\``;
  const now = NOW_MS;
  // The token holds the record with a live lease: what complete, release, renew and recordStep act on.
  const owned = `\`key\` = ? AND token = ? AND ${HELD}`;
  // Nobody holds the record: TTL over, or lease over (released, or its owner gone).
  const dead = `(expires_at <= ${now} OR (state = 'in_progress' AND lock_expires_at <= ${now}))`;
  // In the acquire's UPDATE part, after the token's assignment: whether this statement took the record. The token
  // is new (a random UUID), so it equals VALUES(token) only once taken; `OR dead` gives the same answer where the
  // server evaluates assignments simultaneously (MariaDB's SIMULTANEOUS_ASSIGNMENT) rather than left to right.
  const taken = `(token = VALUES(token) OR ${dead})`;
  // A record carrying steps, within its keep time: resumed. Reads steps and expires_at, assigned after it.
  const resumable = `(steps IS NOT NULL AND expires_at > ${now})`;
  return {
    table: t,
    createTable: createTable(table),
    /**
     * ? key, fingerprint, token, lockTimeoutMs, lockTimeoutMs. One statement: inserts the record, or takes over a
     * dead one in the UPDATE part, which sees the latest committed row under its lock (never a snapshot), so two
     * racing acquirers can never both win. A live record is left exactly as it was. The assignments run left to
     * right, each reading the columns assigned before it: the token first, then what reads the old steps and
     * expiry, then those. The insert id says which branch ran (ACQUIRE_MARK).
     */
    acquire: `INSERT INTO ${t} (\`key\`, fingerprint, state, token, lock_expires_at, expires_at, created_at)
      VALUES (?, ?, 'in_progress', ?, ${now} + ?, ${now} + ?, ${now})
      ON DUPLICATE KEY UPDATE
        token = IF(${dead}, VALUES(token), IF(LAST_INSERT_ID(${ACQUIRE_MARK.held}), token, token)),
        fingerprint = IF(${taken} AND NOT ${resumable}, VALUES(fingerprint), fingerprint),
        keep_until = IF(${taken} AND NOT ${resumable}, NULL, keep_until),
        steps = IF(${taken}, IF(${resumable}, IF(LAST_INSERT_ID(${ACQUIRE_MARK.resumed}), steps, steps), NULL), steps),
        expires_at = IF(${taken}, GREATEST(IF(${resumable}, COALESCE(keep_until, 0), 0), VALUES(expires_at)), expires_at),
        status = IF(${taken}, NULL, status),
        headers = IF(${taken}, NULL, headers),
        body = IF(${taken}, NULL, body),
        created_at = IF(${taken}, VALUES(created_at), created_at),
        lock_expires_at = IF(${taken}, VALUES(lock_expires_at), lock_expires_at),
        state = IF(${taken}, 'in_progress', state)`,
    /**
     * ? key. The live record acquire answers with when it did not take the key (a completed record within its TTL,
     * an in-progress one within its lease); none means it changed since, and acquire runs again.
     */
    live: `SELECT IF(state = 'completed', 'c', 'p') AS s, fingerprint,
        GREATEST(1, lock_expires_at - ${now}) AS retry_ms, status, headers, body
      FROM ${t}
      WHERE \`key\` = ? AND expires_at > ${now} AND (state = 'completed' OR lock_expires_at > ${now})`,
    /** ? key, token. What a taken record kept: its fingerprint and steps (read after a resume). */
    owner: `SELECT token, fingerprint, steps FROM ${t} WHERE \`key\` = ?`,
    /** ? status, headers, body, ttlMs, key, token. Fenced by token and live lease; drops the steps. */
    complete: complete(t, true),
    /** Transactional mode: the transaction holds the key, not a lease, so only the token fences. */
    completeInTransaction: complete(t, false),
    /**
     * ? key, token. Ends the lease now. A record without steps expires with it (it is dead at once: absent to every
     * step, taken by the next acquire, deleted by the reaper); one with steps is kept, released, until keep_until.
     * One UPDATE rather than a DELETE or an UPDATE: MySQL cannot choose between them in one statement.
     */
    release: `UPDATE ${t} SET expires_at = IF(steps IS NULL, ${now}, keep_until), lock_expires_at = ${now}
      WHERE ${owned}`,
    /** ? lockTimeoutMs, lockTimeoutMs, key, token. A record with steps stays at least until its keep_until. */
    renew: `UPDATE ${t} SET lock_expires_at = ${now} + ?, expires_at = GREATEST(COALESCE(keep_until, 0), ${now} + ?)
      WHERE ${owned}`,
    /**
     * ? name, value, ttlMs, ttlMs, key, token. Adds (or replaces) the step and keeps the record until ttlMs from
     * now, or its lease's end if later. Fenced as complete.
     */
    recordStep: `UPDATE ${t} SET steps = JSON_MERGE_PATCH(COALESCE(steps, '{}'), JSON_OBJECT(?, ?)),
        keep_until = ${now} + ?, expires_at = GREATEST(lock_expires_at, ${now} + ?)
      WHERE ${owned}`,
    /**
     * ? key. A live record: completed within its TTL, in progress within its lease, or released (steps, lease
     * over, within keep_until). `released` is derived: a record with steps whose lease ended.
     */
    get: `SELECT ${recordColumns('body')} FROM ${t} WHERE \`key\` = ? AND ${LIVE}`,
    /** ? key. Deletes the live record; `deleteDead` then removes a dead one the reaper has not removed yet. */
    deleteLive: `DELETE FROM ${t} WHERE \`key\` = ? AND ${LIVE}`,
    deleteDead: `DELETE FROM ${t} WHERE \`key\` = ? AND NOT (${LIVE})`,
    /** ? key. The remaining lease of a held key, for waitFor. */
    held: `SELECT lock_expires_at - ${now} AS left_ms FROM ${t}
      WHERE \`key\` = ? AND state = 'in_progress' AND lock_expires_at > ${now} AND expires_at > ${now}`,
    /**
     * Reaper: a batch of expired rows, oldest first, found through the expires_at index; `limit` is a validated
     * integer written into the text (a prepared LIMIT ? is refused by some MySQL 8 versions).
     */
    purge: (limit: number) =>
      `DELETE FROM ${t} WHERE expires_at <= ${now} ORDER BY expires_at LIMIT ${limit}`,
  };
}

function complete(t: string, lease: boolean): string {
  return `UPDATE ${t} SET state = 'completed', status = ?, headers = ?, body = ?, lock_expires_at = NULL,
      steps = NULL, keep_until = NULL, expires_at = ${NOW_MS} + ?
    WHERE \`key\` = ? AND token = ? AND state = 'in_progress'${lease ? ` AND lock_expires_at > ${NOW_MS}` : ''}`;
}

export type Statements = ReturnType<typeof statements>;
