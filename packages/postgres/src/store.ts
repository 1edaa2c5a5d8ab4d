import { randomUUID } from 'node:crypto';
import {
  type AcquireResult,
  type CompletedResult,
  type Duration,
  IdempotencyOptionsError,
  type InProgressResult,
  parseDuration,
  type StoredResponse,
  StoreOperationError,
} from '@oncely/core';
import {
  type AcquireOptions,
  type IdempotencyRecord,
  runStoreTransaction,
  type StoreTransaction,
  type TransactionAcquiredResult,
  type TransactionalIdempotencyStore,
  undoAcquire,
} from '@oncely/core/adapter';
import type { Pool, PoolClient, QueryResultRow } from 'pg';
import { hold } from './client';
import { checkIdentifier, type Statements, statements } from './sql';

export interface PostgresStoreOptions {
  /** A `pg` Pool, yours to end. Each store step is one statement on it. */
  pool: Pool;
  /** Table of the records (the outbox is `<table>_outbox`). Default: `'oncely_idempotency'`. */
  table?: string;
  /** Schema of the table. Default: `'public'`. */
  schema?: string;
  /**
   * Queue every completion in the outbox table, in the same statement, for an `OutboxRelay` to copy to a cache
   * (RedisStore). Default: `false`.
   */
  outbox?: boolean;
}

export interface PurgeOptions {
  /** Rows deleted per statement; small batches keep each delete's locks short. Default: `1000`. */
  batchSize?: number;
  /** Stop after this many batches (the reaper runs again later). Default: `100`. */
  maxBatches?: number;
}

export interface ReaperOptions extends PurgeOptions {
  /** How often the reaper runs. Default: `'1m'`. */
  interval?: Duration;
  /** Called with a reaper failure (the reaper keeps running). Default: ignored. */
  onError?: (error: unknown) => void;
}

export interface Reaper {
  stop(): Promise<void>;
}

const STATE: Record<string, IdempotencyRecord['state']> = {
  in_progress: 'in_progress',
  completed: 'completed',
};

function toResponse(row: { status: number | null; headers: unknown; body: Buffer | null }): StoredResponse {
  return {
    status: Number(row.status),
    headers: (row.headers ?? {}) as StoredResponse['headers'],
    body: row.body ?? Buffer.alloc(0),
  };
}

interface AcquireRow {
  s: 'a' | 'c' | 'p';
  fingerprint: string | null;
  retry_ms: string | null;
  status: number | null;
  headers: unknown;
  body: Buffer | null;
}

/**
 * A store in PostgreSQL: records live in one table, keyed by the idempotency key. Each step is one statement
 * (acquire reads the live record first, so a replay is a plain read; only when there is none does it run an
 * INSERT ... ON CONFLICT ... DO UPDATE ... WHERE the record is dead, which alone decides who owns the key), and
 * every time comes from the database's clock. With `transactional: true` on the adapter (or
 * `store.transaction()` for consumers), the record is written in the same transaction as the handler's own writes.
 */
export class PostgresStore implements TransactionalIdempotencyStore {
  readonly #pool: Pool;
  readonly #sql: Statements;
  readonly #outbox: boolean;
  readonly #lockSpace: string;

  constructor(options: PostgresStoreOptions) {
    if (options === null || typeof options !== 'object' || typeof options.pool?.query !== 'function') {
      throw new IdempotencyOptionsError(
        'pool',
        'is required: new PostgresStore({ pool: new pg.Pool() }).',
        'oncely/postgres',
      );
    }
    const schema = checkIdentifier('schema', options.schema ?? 'public');
    const table = checkIdentifier('table', options.table ?? 'oncely_idempotency');
    if (table.length > 55)
      throw new IdempotencyOptionsError('table', 'must be at most 55 characters.', 'oncely/postgres');
    this.#pool = options.pool;
    this.#sql = statements(schema, table);
    this.#outbox = options.outbox === true;
    this.#lockSpace = `${schema}.${table}:`;
  }

  /** The qualified names of the records and outbox tables, for your own queries. */
  get tables(): { records: string; outbox: string } {
    return { records: this.#sql.table, outbox: this.#sql.outbox };
  }

  /**
   * Creates the schema, the records table and its index if they do not exist, and the outbox table with
   * `outbox: true`. Safe to run twice, and concurrently.
   */
  async migrate(): Promise<void> {
    const held = await hold(this.#pool);
    const { client } = held;
    let failed: unknown;
    try {
      await client.query('BEGIN');
      // Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog: serialise migrations.
      await client.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [
        `${this.#lockSpace}migrate`,
      ]);
      for (const statement of this.#sql.migrate) await client.query(statement);
      if (this.#outbox) for (const statement of this.#sql.migrateOutbox) await client.query(statement);
      await client.query('COMMIT');
    } catch (error) {
      failed = error;
      if (!held.broken(error)) await client.query('ROLLBACK').catch(() => {});
      throw error;
    } finally {
      held.release(held.broken(failed) ? failed : undefined);
    }
  }

  async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    const token = randomUUID();
    try {
      return await this.#acquireOn(this.#pool, key, options, token);
    } catch (error) {
      // A timed-out acquire may still run when a paused server resumes: release its lease behind it (fenced by the
      // token, retried until it lands or the lease lapses), so the key is not blocked for lockTimeout.
      undoAcquire(
        async () => (await this.#pool.query(this.#sql.release, [key, token])).rowCount === 1,
        options.lockTimeoutMs,
      );
      throw error;
    }
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const sql = this.#outbox ? this.#sql.completeWithOutbox : this.#sql.complete;
    const result = await this.#pool.query(sql, [
      key,
      token,
      response.status,
      response.headers,
      toBuffer(response.body),
      ttlMs,
    ]);
    return result.rowCount === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.#pool.query(this.#sql.release, [key, token])).rowCount === 1;
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    return (await this.#pool.query(this.#sql.renew, [key, token, lockTimeoutMs])).rowCount === 1;
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const { rows } = await this.#pool.query(this.#sql.get, [key]);
    const row = rows[0] as
      | {
          state: string;
          fingerprint: string;
          token: string;
          lock_ms: string;
          expires_ms: string;
          status: number | null;
          headers: unknown;
          body: Buffer | null;
        }
      | undefined;
    if (row === undefined) return undefined;
    const record: IdempotencyRecord = {
      state: STATE[row.state] ?? 'in_progress',
      fingerprint: row.fingerprint,
      token: row.token,
      lockExpiresAt: Number(row.lock_ms),
      expiresAt: Number(row.expires_ms),
    };
    if (record.state === 'completed') record.response = toResponse(row);
    return record;
  }

  async delete(key: string): Promise<boolean> {
    const { rows } = await this.#pool.query<{ live: boolean }>(this.#sql.delete, [key]);
    return rows[0]?.live === true;
  }

  /**
   * Transactional mode: opens a transaction on a client of its own, takes the key's advisory lock (never waiting:
   * a duplicate of a running transaction is told "in progress" at once), and reserves the key inside it. The
   * caller's work joins the transaction through `transaction.db`; `commit()` writes the completed record and
   * commits both. If the process dies, PostgreSQL rolls everything back and releases the lock.
   */
  async acquireInTransaction(
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult> {
    const held = await hold(this.#pool);
    const { client } = held;
    let open = false;
    const done = async (rollback: boolean, destroy?: unknown): Promise<void> => {
      // A broken connection gets no ROLLBACK (it would fail, or wait behind a statement that never answers): it is
      // destroyed, and the server rolls back the session it loses.
      if (rollback && open && !held.broken(destroy))
        await client.query('ROLLBACK').catch((error: unknown) => (destroy ??= error));
      open = false;
      // A client whose rollback failed is broken: release it with the error so the pool discards it.
      held.release(destroy);
    };
    try {
      await client.query('BEGIN');
      open = true;
      const { rows } = await client.query(this.#sql.tryLock, [this.#lockSpace + key]);
      if (rows[0]?.locked !== true) {
        await done(true);
        return { status: 'in_progress', fingerprint: options.fingerprint, retryAfterMs: 1000 };
      }
      // After the lock, a fresh statement (and snapshot): a record committed before we got the lock is seen.
      const result = await this.#acquireOn(client, key, options);
      if (result.status !== 'acquired') {
        await done(true);
        return result;
      }
      const { token } = result;
      const sql = this.#outbox ? this.#sql.completeInTransactionWithOutbox : this.#sql.completeInTransaction;
      let settled = false;
      const transaction: StoreTransaction = {
        db: client,
        commit: async (response, ttlMs) => {
          if (settled) return false;
          settled = true;
          try {
            const updated = await client.query(sql, [
              key,
              token,
              response.status,
              response.headers,
              toBuffer(response.body),
              ttlMs,
            ]);
            if (updated.rowCount !== 1) {
              await done(true);
              return false;
            }
            await client.query('COMMIT');
            open = false;
            await done(false);
            return true;
          } catch (error) {
            await done(true, error);
            throw error;
          }
        },
        rollback: async () => {
          if (settled) return;
          settled = true;
          await done(true);
        },
      };
      return { status: 'acquired', token, transaction };
    } catch (error) {
      await done(true, error);
      throw error;
    }
  }

  /**
   * Runs `work` once per key, inside one transaction that also writes the completion (for message consumers
   * whose side effects are in this database). Duplicates get the stored result; a duplicate of a transaction
   * still running gets core's `IdempotencyInProgressError` (so `settlementFor` delays it, like `idempotent()`'s);
   * a key reused with another fingerprint gets `IdempotencyMismatchError`; an error thrown by `work` rolls
   * everything back and is re-thrown (the next delivery runs again). The result must be JSON-serialisable.
   */
  async transaction<T>(
    key: string,
    options: { fingerprint?: string; ttl?: Duration },
    work: (client: PoolClient) => Promise<T>,
  ): Promise<{ outcome: 'executed' | 'replayed'; result: T }> {
    const ttlMs = parseDuration(options.ttl ?? '24h');
    return runStoreTransaction<T, PoolClient>(this, key, { fingerprint: options.fingerprint, ttlMs }, work);
  }

  /**
   * Deletes expired records in small batches (`FOR UPDATE SKIP LOCKED`, oldest first, using the expires_at
   * index), until none is left or `maxBatches` ran. Resolves to the number deleted.
   */
  async purgeExpired(options: PurgeOptions = {}): Promise<number> {
    const batchSize = options.batchSize ?? 1000;
    const maxBatches = options.maxBatches ?? 100;
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      const deleted = (await this.#pool.query(this.#sql.purge, [batchSize])).rowCount ?? 0;
      total += deleted;
      if (deleted < batchSize) break;
    }
    return total;
  }

  /** Runs `purgeExpired` every `interval` (timer `unref`'d, one run at a time) until `stop()`. */
  startReaper(options: ReaperOptions = {}): Reaper {
    const intervalMs = parseDuration(options.interval ?? '1m');
    let running: Promise<unknown> = Promise.resolve();
    let stopped = false;
    const timer = setInterval(() => {
      running = running
        .then(() => (stopped ? 0 : this.purgeExpired(options)))
        .catch((error: unknown) => options.onError?.(error));
    }, intervalMs);
    timer.unref();
    return {
      stop: async () => {
        stopped = true;
        clearInterval(timer);
        await running;
      },
    };
  }

  /** @internal whether completions are queued in the outbox (`outbox: true`) */
  get queuesOutbox(): boolean {
    return this.#outbox;
  }

  /** @internal the relay's view of the outbox */
  get statements(): Statements {
    return this.#sql;
  }

  /** @internal */
  get pool(): Pool {
    return this.#pool;
  }

  async #acquireOn(
    db: Pool | PoolClient,
    key: string,
    { fingerprint, lockTimeoutMs }: AcquireOptions,
    token: string = randomUUID(),
  ): Promise<AcquireResult> {
    // An empty answer means the row appeared after this statement's snapshot (its read saw no live record, its
    // INSERT met one): run it again with a fresh snapshot, whose read sees that row.
    for (let attempt = 0; attempt < 10; attempt++) {
      const { rows } = await db.query<AcquireRow & QueryResultRow>(this.#sql.acquire, [
        key,
        fingerprint,
        token,
        lockTimeoutMs,
      ]);
      const row = rows[0];
      if (row === undefined) continue;
      if (row.s === 'a') return { status: 'acquired', token };
      if (row.s === 'p')
        return {
          status: 'in_progress',
          fingerprint: row.fingerprint ?? '',
          retryAfterMs: Number(row.retry_ms),
        };
      return { status: 'completed', fingerprint: row.fingerprint ?? '', response: toResponse(row) };
    }
    throw new StoreOperationError(
      `oncely/postgres: acquire for key ${JSON.stringify(key)} found no stable answer after 10 attempts`,
    );
  }
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}
