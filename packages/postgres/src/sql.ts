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

const ms = (column: string) => `(extract(epoch FROM ${column}) * 1000)::bigint`;

export function statements(schema: string, table: string) {
  const t = `"${schema}"."${table}"`;
  const outbox = `"${schema}"."${table}_outbox"`;
  const lease = `clock_timestamp() + $4 * interval '1 millisecond'`;
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
        expires_at timestamptz NOT NULL
      )`,
      // The reaper's index: it deletes the oldest expired rows first.
      `CREATE INDEX IF NOT EXISTS "${table}_expires_at_idx" ON ${t} (expires_at)`,
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
     * Only when `live` is empty does the INSERT run: it takes the key if it is free or its record is dead (TTL or
     * lease over). Its conflict check and its DO UPDATE ... WHERE see the latest committed row, not the snapshot,
     * so two racing acquirers can never both win; it alone decides 'acquired'. If `live` saw nothing but the
     * INSERT meets a live row (committed after the snapshot), the statement returns nothing, and the caller simply
     * runs it again with a fresh snapshot, whose `live` then sees that row.
     * `live` and the takeover test are exact complements (expires_at > / <= clock_timestamp()); an in-progress
     * record's expires_at is its lease end.
     * $1 key, $2 fingerprint, $3 token, $4 lockTimeoutMs.
     */
    acquire: `WITH live AS MATERIALIZED (
        SELECT CASE r.state WHEN 'completed' THEN 'c' ELSE 'p' END AS s, r.fingerprint,
               greatest(1, ${ms('r.lock_expires_at')} - ${ms('clock_timestamp()')}) AS retry_ms,
               r.status, r.headers, r.body
        FROM ${t} r
        WHERE r.key = $1 AND r.expires_at > clock_timestamp()
      ), taken AS (
        INSERT INTO ${t} AS r (key, fingerprint, state, token, lock_expires_at, expires_at, created_at)
        SELECT $1, $2, 'in_progress', $3, ${lease}, ${lease}, clock_timestamp()
        WHERE NOT EXISTS (SELECT 1 FROM live)
        ON CONFLICT (key) DO UPDATE SET
          fingerprint = excluded.fingerprint, state = 'in_progress', token = excluded.token,
          lock_expires_at = excluded.lock_expires_at, expires_at = excluded.expires_at,
          status = NULL, headers = NULL, body = NULL, created_at = excluded.created_at
        WHERE r.expires_at <= clock_timestamp()
        RETURNING 1
      )
      SELECT 'a' AS s, NULL::text AS fingerprint, NULL::bigint AS retry_ms, NULL::integer AS status,
             NULL::jsonb AS headers, NULL::bytea AS body
      FROM taken
      UNION ALL
      SELECT s, fingerprint, retry_ms, status, headers, body FROM live`,
    /** $1 key, $2 token, $3 status, $4 headers, $5 body, $6 ttlMs. Fenced by token and live lease. */
    complete: complete(t, outbox, { lease: true, outbox: false }),
    /** The same, also queuing the key for the outbox relay, in the same statement. */
    completeWithOutbox: complete(t, outbox, { lease: true, outbox: true }),
    /** Transactional mode: the transaction's advisory lock holds the key, not a lease, so only the token fences. */
    completeInTransaction: complete(t, outbox, { lease: false, outbox: false }),
    completeInTransactionWithOutbox: complete(t, outbox, { lease: false, outbox: true }),
    /** $1 key, $2 token. */
    release: `DELETE FROM ${t}
      WHERE key = $1 AND token = $2 AND state = 'in_progress' AND lock_expires_at > clock_timestamp()`,
    /** $1 key, $2 token, $3 lockTimeoutMs. */
    renew: `UPDATE ${t} SET lock_expires_at = clock_timestamp() + $3 * interval '1 millisecond',
        expires_at = clock_timestamp() + $3 * interval '1 millisecond'
      WHERE key = $1 AND token = $2 AND state = 'in_progress' AND lock_expires_at > clock_timestamp()`,
    get: `SELECT state, fingerprint, token, coalesce(${ms('lock_expires_at')}, 0) AS lock_ms, status, headers, body,
        ${ms('expires_at')} AS expires_ms
      FROM ${t} WHERE key = $1 AND expires_at > clock_timestamp()`,
    /** $1 key. `live` is false for a row whose lease or TTL ran out and that the reaper has not removed yet. */
    delete: `DELETE FROM ${t} WHERE key = $1 RETURNING expires_at > clock_timestamp() AS live`,
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
        ${ms('r.expires_at')} - ${ms('clock_timestamp()')} AS ttl_ms
      FROM ${outbox} o LEFT JOIN ${t} r ON r.key = o.key AND r.state = 'completed' AND r.expires_at > clock_timestamp()
      ORDER BY o.id LIMIT $1
      FOR UPDATE OF o SKIP LOCKED`,
    deleteOutbox: `DELETE FROM ${outbox} WHERE id = ANY($1::bigint[])`,
  };
}

function complete(t: string, outbox: string, options: { lease: boolean; outbox: boolean }): string {
  const update = `UPDATE ${t} SET state = 'completed', status = $3, headers = $4, body = $5, lock_expires_at = NULL,
      expires_at = clock_timestamp() + $6 * interval '1 millisecond'
    WHERE key = $1 AND token = $2 AND state = 'in_progress'${options.lease ? ' AND lock_expires_at > clock_timestamp()' : ''}`;
  return options.outbox
    ? `WITH done AS (${update} RETURNING key) INSERT INTO ${outbox} (key) SELECT key FROM done`
    : update;
}

export type Statements = ReturnType<typeof statements>;
