import { IdempotencyOptionsError } from '@oncely/core';

/**
 * Every statement of the store, built once per store from its (validated, quoted) table name. Times are the
 * database's: `clock_timestamp()` (not `now()`, which is frozen at the start of a transaction, and the
 * transactional mode holds one open for the whole handler). Epoch milliseconds are computed in SQL so that no
 * timestamp is parsed in JavaScript.
 */

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

export function checkIdentifier(option: string, value: string): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new IdempotencyOptionsError(
      option,
      `must be a plain SQL identifier (letters, digits, _; at most 63); got ${JSON.stringify(value)}.`,
      'oncely/postgres',
    );
  }
  return value;
}

/*
 * Column aliases are single lower-case words: a library that renames columns (postgres.js or Knex turning
 * snake_case into camelCase) leaves them as they are. A JSON parameter is cast from text (`$4::text::jsonb`): every
 * library sends text as it is, where some would encode a string again for a jsonb parameter.
 */
const ms = (column: string) => `(extract(epoch FROM ${column}) * 1000)::bigint`;

/**
 * The columns that steps added to the table. `migrate` adds them to a table made before them; a table that has
 * both is not altered again (ALTER TABLE takes an exclusive lock even when IF NOT EXISTS finds nothing to do).
 */
const STEP_COLUMNS = ['steps', 'keep_until'] as const;

/**
 * A live record: completed within its TTL, in progress within its lease, or released (it carries steps, its lease
 * ended, and it is within keep_until). A condition on the records table's columns.
 */
const LIVE = `expires_at > clock_timestamp()
  AND (state = 'completed' OR steps IS NOT NULL OR lock_expires_at > clock_timestamp())`;

/** A record whose owner holds a live lease. */
const HELD = `state = 'in_progress' AND lock_expires_at > clock_timestamp()`;

/**
 * The columns `toRecord` decodes, `body` being the expression the body is read with. `released` is derived: a
 * record with steps whose lease ended. Steps are shown only while the record is in progress.
 */
function recordColumns(body: string): string {
  return `state, fingerprint, token, coalesce(${ms('lock_expires_at')}, 0) AS lockms, status, headers,
    ${body} AS body, ${ms('expires_at')} AS expiresms, CASE WHEN state = 'in_progress' THEN steps END AS steps,
    state = 'in_progress' AND lock_expires_at <= clock_timestamp() AS released`;
}

/**
 * How the records table is laid out, for a tool that reads records without going through a store (the `oncely`
 * command): the table, its key column, the SQL conditions of a live and of a held record, and the columns a row
 * is read with for `decodeRecord`. Conditions and columns name the table's columns unqualified.
 */
export interface RecordsLayout {
  /** The records table, schema-qualified and quoted. */
  table: string;
  /** The primary key column (text): the store key. */
  key: string;
  /** True of a live record (completed within its TTL, in progress within its lease, or released). */
  live: string;
  /** True of a record whose lease is held now. */
  held: string;
  /** A live record's state (text: 'in_progress', 'completed' or 'released'); NULL for a dead one. */
  state: string;
  /**
   * The columns `decodeRecord` reads: the key, the record, its creation time, its size and the database's clock.
   * With `bodyBytes`, the body is read up to that many bytes (its full length is still decoded).
   */
  columns(options?: { bodyBytes?: number }): string;
}

/** The layout of the records table `PostgresStore` keeps with these options. */
export function recordsLayout(options: { schema?: string; table?: string } = {}): RecordsLayout {
  const schema = checkIdentifier('schema', options.schema ?? DEFAULT_SCHEMA);
  const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE);
  return {
    table: `"${schema}"."${table}"`,
    key: 'key',
    live: LIVE,
    held: HELD,
    state: `CASE WHEN (${LIVE}) IS NOT TRUE THEN NULL WHEN state = 'completed' THEN 'completed'
      WHEN lock_expires_at > clock_timestamp() THEN 'in_progress' ELSE 'released' END`,
    columns: ({ bodyBytes } = {}) => {
      const body =
        bodyBytes === undefined ? 'body' : `substring(body FROM 1 FOR ${Math.max(0, Math.trunc(bodyBytes))})`;
      return `key, ${recordColumns(body)}, octet_length(body) AS bodylength, ${ms('created_at')} AS createdms,
        pg_column_size("${table}".*) AS rowbytes, ${ms('clock_timestamp()')} AS nowms`;
    },
  };
}

/** The schema of the records table when the store is given no `schema`. */
export const DEFAULT_SCHEMA = 'public';
/** The records table the store uses when it is given no `table`. */
export const DEFAULT_TABLE = 'oncely_idempotency';

export function statements(schema: string, table: string) {
  const t = `"${schema}"."${table}"`;
  const outbox = `"${schema}"."${table}_outbox"`;
  const lease = `clock_timestamp() + $4 * interval '1 millisecond'`;
  // A record carrying steps, taken within its keep time: resumed (in the acquire's DO UPDATE, `r` the old row).
  const resumable = '(r.steps IS NOT NULL AND r.expires_at > excluded.created_at)';
  // The token holds the record with a live lease: what complete, release, renew and recordStep act on.
  const owned = `key = $1 AND token = $2 AND ${HELD}`;
  return {
    table: t,
    outbox,
    migrate: [
      `CREATE SCHEMA IF NOT EXISTS "${schema}"`,
      `CREATE TABLE IF NOT EXISTS ${t} (
        key text PRIMARY KEY,
        fingerprint text NOT NULL,
        state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
        token text NOT NULL,
        lock_expires_at timestamptz,
        status integer,
        headers jsonb,
        body bytea,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        expires_at timestamptz NOT NULL,
        steps jsonb,
        keep_until timestamptz
      )`,
      // The reaper's index: it deletes the oldest expired rows first.
      `CREATE INDEX IF NOT EXISTS "${table}_expires_at_idx" ON ${t} (expires_at)`,
      // Upgrades a table made before steps in place: nullable columns without a default, so no table rewrite.
      `DO $$BEGIN
        IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '${t}'::regclass AND NOT attisdropped
            AND attname IN (${STEP_COLUMNS.map((c) => `'${c}'`).join(', ')})) < ${STEP_COLUMNS.length} THEN
          ALTER TABLE ${t} ADD COLUMN IF NOT EXISTS steps jsonb, ADD COLUMN IF NOT EXISTS keep_until timestamptz;
        END IF;
      END$$`,
    ],
    /** Run by migrate() after `migrate` for a store with `outbox: true` only. */
    migrateOutbox: [
      `CREATE TABLE IF NOT EXISTS ${outbox} (
        id bigserial PRIMARY KEY,
        key text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp()
      )`,
    ],
    /**
     * One statement, read first. `live` reads the key's live record (a completed record within its TTL, or an
     * in-progress one within its lease) from the statement's snapshot. If there is one, the INSERT gets no row to
     * insert, so it touches, locks and writes nothing: the answer is that record, true at the snapshot, and the
     * whole statement is a plain read (no transaction id, no WAL, no commit flush, no wait on the row's lock).
     * Only when `live` is empty does the INSERT run: it takes the key if it is free or its record is not held
     * (TTL over, lease over, or released). Its conflict check and its DO UPDATE ... WHERE see the latest committed
     * row, not the snapshot, so two racing acquirers can never both win; it alone decides 'acquired'. If `live`
     * saw nothing but the INSERT meets a live row (committed after the snapshot), the statement returns nothing,
     * and the caller simply runs it again with a fresh snapshot, whose `live` then sees that row.
     * `live` and the takeover test are exact complements. A taken record that carries steps and is within its
     * keep time (expires_at) is resumed: it keeps its fingerprint, steps and keep_until, and answers them; any
     * other is overwritten. The DO UPDATE reads one instant, the new row's created_at, so that its tests agree.
     * $1 key, $2 fingerprint, $3 token, $4 lockTimeoutMs.
     */
    acquire: `WITH live AS MATERIALIZED (
        SELECT CASE r.state WHEN 'completed' THEN 'c' ELSE 'p' END AS s, r.fingerprint,
               greatest(1, ${ms('r.lock_expires_at')} - ${ms('clock_timestamp()')}) AS retryms,
               r.status, r.headers, r.body
        FROM ${t} r
        WHERE r.key = $1 AND r.expires_at > clock_timestamp()
          AND (r.state = 'completed' OR r.lock_expires_at > clock_timestamp())
      ), taken AS (
        INSERT INTO ${t} AS r (key, fingerprint, state, token, lock_expires_at, expires_at, created_at)
        SELECT $1, $2, 'in_progress', $3, l.lease, l.lease, clock_timestamp()
        FROM (SELECT ${lease} AS lease) l
        WHERE NOT EXISTS (SELECT 1 FROM live)
        ON CONFLICT (key) DO UPDATE SET
          fingerprint = CASE WHEN ${resumable} THEN r.fingerprint ELSE excluded.fingerprint END,
          steps = CASE WHEN ${resumable} THEN r.steps END,
          keep_until = CASE WHEN ${resumable} THEN r.keep_until END,
          expires_at = greatest(CASE WHEN ${resumable} THEN r.keep_until END, excluded.expires_at),
          state = 'in_progress', token = excluded.token, lock_expires_at = excluded.lock_expires_at,
          status = NULL, headers = NULL, body = NULL, created_at = excluded.created_at
        WHERE r.expires_at <= excluded.created_at
          OR (r.state = 'in_progress' AND r.lock_expires_at <= excluded.created_at)
        RETURNING r.fingerprint, r.steps
      )
      SELECT 'a' AS s, fingerprint, NULL::bigint AS retryms, NULL::integer AS status,
             NULL::jsonb AS headers, NULL::bytea AS body, steps
      FROM taken
      UNION ALL
      SELECT s, fingerprint, retryms, status, headers, body, NULL::jsonb FROM live`,
    /** $1 key, $2 token, $3 status, $4 headers, $5 body, $6 ttlMs. Fenced by token and live lease. */
    complete: complete(t, outbox, { lease: true, outbox: false }),
    /** The same, also queuing the key for the outbox relay, in the same statement. */
    completeWithOutbox: complete(t, outbox, { lease: true, outbox: true }),
    /** Transactional mode: the transaction's advisory lock holds the key, not a lease, so only the token fences. */
    completeInTransaction: complete(t, outbox, { lease: false, outbox: false }),
    completeInTransactionWithOutbox: complete(t, outbox, { lease: false, outbox: true }),
    /**
     * $1 key, $2 token. A record without steps is deleted; one with steps is kept, released: its lease ends now and
     * it stays until keep_until. The UPDATE runs only when the DELETE removed nothing, so a record without steps
     * is read once, as before steps.
     */
    release: `WITH gone AS (
        DELETE FROM ${t} WHERE ${owned} AND steps IS NULL RETURNING 1
      ), kept AS (
        UPDATE ${t} SET lock_expires_at = clock_timestamp(), expires_at = keep_until
        WHERE NOT EXISTS (SELECT 1 FROM gone) AND ${owned} AND steps IS NOT NULL RETURNING 1
      )
      SELECT 1 FROM gone UNION ALL SELECT 1 FROM kept`,
    /** $1 key, $2 token, $3 lockTimeoutMs. A record with steps stays at least until its keep_until. */
    renew: `UPDATE ${t} SET lock_expires_at = l.lease, expires_at = greatest(keep_until, l.lease)
      FROM (SELECT clock_timestamp() + $3 * interval '1 millisecond' AS lease) l
      WHERE ${owned}`,
    /**
     * $1 key, $2 token, $3 name, $4 value, $5 ttlMs. Adds (or replaces) the step and keeps the record until ttlMs
     * from now, or its lease's end if later. Fenced as complete.
     */
    recordStep: `UPDATE ${t} SET steps = coalesce(steps, '{}'::jsonb) || jsonb_build_object($3::text, $4::text),
        keep_until = k.until, expires_at = greatest(lock_expires_at, k.until)
      FROM (SELECT clock_timestamp() + $5 * interval '1 millisecond' AS until) k
      WHERE ${owned}`,
    /**
     * A live record: completed within its TTL, in progress within its lease, or released (steps, lease over,
     * within keep_until). `released` is derived: a record with steps whose lease ended.
     */
    get: `SELECT ${recordColumns('body')} FROM ${t} WHERE key = $1 AND ${LIVE}`,
    /** $1 key. `live` is false for a row whose lease or TTL ran out and that the reaper has not removed yet. */
    delete: `DELETE FROM ${t} WHERE key = $1 RETURNING ${LIVE} AS live`,
    /**
     * Transactional mode: a transaction-scoped advisory lock on the key, tried, never waited for: a duplicate of a
     * running transaction learns "in progress" at once instead of blocking on its uncommitted row.
     */
    tryLock: `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)) AS locked`,
    /**
     * Reaper: a small batch of expired rows, oldest first, skipping rows another transaction holds, so several
     * reapers (or a reaper and live traffic) never wait on each other and no lock is held for long.
     */
    purge: `DELETE FROM ${t} WHERE key IN (
        SELECT key FROM ${t} WHERE expires_at <= clock_timestamp()
        ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
      )`,
    /** Outbox relay: claim a batch of queued completions, with what is needed to copy each to the cache. */
    claimOutbox: `SELECT o.id, o.key, r.fingerprint, r.status, r.headers, r.body,
        ${ms('r.expires_at')} - ${ms('clock_timestamp()')} AS ttlms
      FROM ${outbox} o LEFT JOIN ${t} r ON r.key = o.key AND r.state = 'completed' AND r.expires_at > clock_timestamp()
      ORDER BY o.id LIMIT $1
      FOR UPDATE OF o SKIP LOCKED`,
    deleteOutbox: `DELETE FROM ${outbox} WHERE id = ANY($1::bigint[])`,
  };
}

function complete(t: string, outbox: string, options: { lease: boolean; outbox: boolean }): string {
  // A completed record holds only its response: its steps go.
  const update = `UPDATE ${t} SET state = 'completed', status = $3, headers = $4::text::jsonb, body = $5, lock_expires_at = NULL,
      steps = NULL, keep_until = NULL, expires_at = clock_timestamp() + $6 * interval '1 millisecond'
    WHERE key = $1 AND token = $2 AND state = 'in_progress'${options.lease ? ' AND lock_expires_at > clock_timestamp()' : ''}`;
  return options.outbox
    ? `WITH done AS (${update} RETURNING key) INSERT INTO ${outbox} (key) SELECT key FROM done`
    : update;
}

export type Statements = ReturnType<typeof statements>;
