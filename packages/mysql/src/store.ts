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
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
  runStoreTransaction,
  type SqlTransactions,
  startReaper,
  type TransactionAcquiredResult,
  type TransactionalIdempotencyStore,
  undoAcquire,
} from '@oncely/core/adapter';
import type { Pool, PoolConnection } from 'mysql2/promise';
import { completeParams, steps, toRecord, toResponse } from './rows';
import { ACQUIRE_MARK, checkIdentifier, DEFAULT_TABLE, type Statements, statements } from './sql';
import { TransactionalMode } from './transaction';

/**
 * Options of {@link MySQLStore}: the pool, the table, and optionally a library's transactions; `Tx` is the type of
 * the transaction a handler gets in transactional mode.
 */
export interface MySQLStoreOptions<Tx = PoolConnection> {
  /**
   * A `mysql2/promise` Pool, yours to end (`pool.end()`); each store step is one statement on it. Give it timeouts
   * (docs/stores/mysql.md, "Outages and pool settings"). Required.
   */
  pool: Pool;
  /** Table of the records, in the pool's database. Default: `'oncely_idempotency'`. */
  table?: string;
  /**
   * Transactional mode through a database library of yours (an ORM from `@oncely/orm`): the handler's writes and
   * the completed record commit in one transaction of that library. Its `dialect` must be `'mysql'`.
   * Default: none (transactions on the pool's own connections).
   */
  transactions?: SqlTransactions<Tx>;
}

export type { PurgeOptions, Reaper, ReaperOptions } from '@oncely/core/adapter';

/** One statement's answer: rows of a SELECT, or what an INSERT, UPDATE or DELETE did. */
export interface Outcome {
  rows: Record<string, unknown>[];
  /** Rows the statement's WHERE matched (UPDATE), or affected (INSERT, DELETE). */
  matched: number;
  /** The OK packet's insert id, where the runner sees it (an ORM may not pass it on). */
  insertId?: number;
}

/** Runs one statement with `?` placeholders: on the pool, or on a transaction's connection. */
export type Run = (statement: string, params: readonly unknown[]) => Promise<Outcome>;

/** A statement run on a mysql2 pool or connection (prepared: parameters never pass through text escaping). */
export function runOn(db: Pick<Pool, 'execute'>): Run {
  return async (statement, params) => {
    const [result] = await db.execute(statement, params as Parameters<Pool['execute']>[1]);
    if (Array.isArray(result)) return { rows: result as Record<string, unknown>[], matched: result.length };
    const header = result as { affectedRows: number; insertId: number; info?: string };
    return { rows: [], matched: matchedRows(header), insertId: header.insertId };
  };
}

/**
 * Rows an UPDATE matched, whatever the connection's CLIENT_FOUND_ROWS flag (mysql2 sets it by default; without it,
 * affected rows count only rows whose values changed, and a renew within the same millisecond changes none). The
 * server says it in the OK packet's info: "Rows matched: 1  Changed: 0  Warnings: 0".
 */
export function matchedRows(header: { affectedRows: number; info?: string }): number {
  const match = /Rows matched:\s*(\d+)/i.exec(header.info ?? '');
  return match === null ? header.affectedRows : Number(match[1]);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** MySQL's deadlock error: the statement was rolled back, and running it again is safe. */
const ER_LOCK_DEADLOCK = 1213;

function isDeadlock(error: unknown): boolean {
  return (error as { errno?: unknown } | null)?.errno === ER_LOCK_DEADLOCK;
}

/**
 * A store in MySQL 8 or MariaDB 10.6+, over a `mysql2` pool: records live in one InnoDB table, keyed by the
 * idempotency key, and every time comes from the database's clock. Acquire is one INSERT ... ON DUPLICATE KEY
 * UPDATE that takes the key only if it is free or its record is dead (a second statement reads the record it did
 * not take); complete, release, renew and recordStep are one UPDATE each, fenced by the token and a live lease.
 */
export class MySQLStore<Tx = PoolConnection> implements TransactionalIdempotencyStore {
  readonly #pool: Pool;
  readonly #run: Run;
  readonly #sql: Statements;
  readonly #tableName: string;
  readonly #transactions: SqlTransactions<Tx> | undefined;
  readonly #reapers = new Set<Reaper>();
  readonly #transactional: TransactionalMode<Tx> = new TransactionalMode<Tx>(this);

  /**
   * Makes a store on `options.pool`, which stays yours to end. Create its table with `migrate()`. Throws
   * `IdempotencyOptionsError` when an option is missing or wrong.
   */
  constructor(options: MySQLStoreOptions<Tx>) {
    if (
      options === null ||
      typeof options !== 'object' ||
      typeof options.pool?.execute !== 'function' ||
      typeof options.pool?.getConnection !== 'function'
    ) {
      throw new IdempotencyOptionsError(
        'pool',
        "is required: a mysql2 promise Pool, new MySQLStore({ pool: mysql.createPool(url) }) with mysql from 'mysql2/promise'.",
        'oncely/mysql',
      );
    }
    const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE);
    // The index name is `<table>_expires_at_idx`, and MySQL names are at most 64 characters.
    if (table.length > 48)
      throw new IdempotencyOptionsError('table', 'must be at most 48 characters.', 'oncely/mysql');
    const transactions = options.transactions;
    if (transactions !== undefined) {
      if (
        transactions === null ||
        typeof transactions !== 'object' ||
        typeof transactions.run !== 'function' ||
        typeof transactions.query !== 'function'
      ) {
        throw new IdempotencyOptionsError(
          'transactions',
          'must be a SqlTransactions object (from @oncely/orm), with run() and query().',
          'oncely/mysql',
        );
      }
      if (transactions.dialect !== 'mysql') {
        throw new IdempotencyOptionsError(
          'transactions',
          `is for ${JSON.stringify(transactions.dialect)}, not MySQL: pass the library's MySQL transactions.`,
          'oncely/mysql',
        );
      }
    }
    this.#pool = options.pool;
    this.#run = runOn(options.pool);
    this.#sql = statements(table);
    this.#tableName = table;
    this.#transactions = transactions;
  }

  /** The records table's name, quoted, for your own queries. */
  get table(): string {
    return this.#sql.table;
  }

  /**
   * Creates the records table and its expires_at index if they do not exist. Safe to run twice, and concurrently
   * (under a named lock, GET_LOCK, held for at most 30 s). The statement is also `MySQLStore.createTableSql()`.
   */
  async migrate(): Promise<void> {
    const connection = await this.#pool.getConnection();
    const lock = `oncely:migrate:${this.#tableName}`;
    let locked = false;
    try {
      // Named locks are server-wide: the database's name joins the table's (SHA1 keeps it within 64 characters).
      const [rows] = await connection.query(
        'SELECT GET_LOCK(CONCAT(?, SHA1(CONCAT(DATABASE(), ?))), 30) AS locked',
        ['oncely:', lock],
      );
      locked = Number((rows as { locked: unknown }[])[0]?.locked) === 1;
      if (!locked)
        throw new StoreOperationError(`oncely/mysql: migrate could not take the lock ${lock} within 30 s`);
      await connection.query(this.#sql.createTable);
    } finally {
      try {
        if (locked)
          await connection.query('SELECT RELEASE_LOCK(CONCAT(?, SHA1(CONCAT(DATABASE(), ?))))', [
            'oncely:',
            lock,
          ]);
      } finally {
        connection.release();
      }
    }
  }

  /** The CREATE TABLE statement `migrate()` runs, for a migration tool of yours. */
  static createTableSql(table = DEFAULT_TABLE): string {
    return statements(checkIdentifier('table', table)).createTable;
  }

  async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    const token = randomUUID();
    try {
      return await this.acquireOn(this.#run, key, options, token);
    } catch (error) {
      // A timed-out acquire may still run when a paused server resumes: release its lease behind it (fenced by the
      // token, retried until it lands or the lease lapses), so the key is not blocked for lockTimeout.
      undoAcquire(() => this.release(key, token), options.lockTimeoutMs);
      throw error;
    }
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const { matched } = await this.#run(this.#sql.complete, completeParams(key, token, response, ttlMs));
    return matched === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.#run(this.#sql.release, [key, token])).matched === 1;
  }

  /**
   * Records a step's result in the record's `steps` column, one UPDATE fenced like `complete`. From then on the
   * record outlives its lease as `released` (until `ttlMs` after its latest step, or its lease's end if later),
   * and the next `acquire` resumes it.
   */
  async recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    return (await this.#run(this.#sql.recordStep, [name, value, ttlMs, ttlMs, key, token])).matched === 1;
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    return (await this.#run(this.#sql.renew, [lockTimeoutMs, lockTimeoutMs, key, token])).matched === 1;
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const row = (await this.#run(this.#sql.get, [key])).rows[0];
    return row === undefined ? undefined : toRecord(row);
  }

  /**
   * Deletes the record whatever its state; `true` if it was live. One DELETE of the live record; only when there
   * was none, a second one removes a dead record the reaper has not deleted yet (MySQL has no DELETE ... RETURNING
   * to tell the two apart in one statement).
   */
  async delete(key: string): Promise<boolean> {
    if ((await this.#run(this.#sql.deleteLive, [key])).matched === 1) return true;
    await this.#run(this.#sql.deleteDead, [key]);
    return false;
  }

  /**
   * Resolves once the key is not held by a live lease, or after `timeoutMs`. MySQL has no notification a
   * connection could wait on without holding it for the whole wait, so this polls (one primary-key read), from
   * 10 ms doubling to 250 ms, never past the lease's end or the timeout.
   */
  async waitFor(key: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let pause = 10;
    for (;;) {
      const row = (await this.#run(this.#sql.held, [key])).rows[0];
      if (row === undefined) return;
      const left = deadline - Date.now();
      if (left <= 0) return;
      await sleep(Math.max(1, Math.min(pause, left, Number(row.left_ms))));
      pause = Math.min(pause * 2, 250);
    }
  }

  /**
   * Deletes expired records in batches (`DELETE ... WHERE expires_at <= now ORDER BY expires_at LIMIT n`, through
   * the expires_at index, each its own short autocommit statement), until none is left or `maxBatches` ran.
   * Resolves to the number deleted.
   */
  async purgeExpired(options: PurgeOptions = {}): Promise<number> {
    const batchSize = positiveInteger('batchSize', options.batchSize ?? 1000);
    const maxBatches = positiveInteger('maxBatches', options.maxBatches ?? 100);
    const statement = this.#sql.purge(batchSize);
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      let deleted: number;
      try {
        deleted = (await this.#run(statement, [])).matched;
      } catch (error) {
        // A deadlock with live traffic rolled this batch back: the next batch (or the next run) takes it.
        if (!isDeadlock(error)) throw error;
        continue;
      }
      total += deleted;
      if (deleted < batchSize) break;
    }
    return total;
  }

  /** Runs `purgeExpired` every `interval` (timer `unref`'d, one run at a time) until `stop()`. */
  startReaper(options: ReaperOptions = {}): Reaper {
    positiveInteger('batchSize', options.batchSize ?? 1000);
    positiveInteger('maxBatches', options.maxBatches ?? 100);
    const reaper = startReaper((purge) => this.purgeExpired(purge), options);
    this.#reapers.add(reaper);
    return {
      stop: async () => {
        this.#reapers.delete(reaper);
        await reaper.stop();
      },
    };
  }

  /**
   * Transactional mode: holds the key in a transaction that the caller's work joins through `transaction.db` (a
   * connection of the pool, or the transaction of the library given as `transactions`); `commit()` writes the
   * completed record and commits both. A duplicate of a transaction still open is told "in progress" at once
   * (a named lock, tried, never waited for). If the process dies, the server rolls everything back.
   */
  acquireInTransaction(
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult> {
    return this.#transactional.acquire(key, options);
  }

  /**
   * Runs `work` once per key, inside one transaction that also writes the completion (for message consumers
   * whose side effects are in this database). Duplicates get the stored result; a duplicate of a transaction
   * still running gets core's `IdempotencyInProgressError`; a key reused with another fingerprint gets
   * `IdempotencyMismatchError`; an error thrown by `work` rolls everything back and is re-thrown (the next delivery
   * runs again). The result must be JSON-serialisable.
   */
  transaction<T>(
    key: string,
    options: { fingerprint?: string; ttl?: Duration },
    work: (db: Tx) => Promise<T>,
  ): Promise<{
    /** `'executed'`: `work` ran and committed now; `'replayed'`: an earlier run's stored result. */
    outcome: 'executed' | 'replayed';
    /** What `work` returned, now or in the run whose result was stored. */
    result: T;
  }> {
    const ttlMs = parseDuration(options.ttl ?? '24h');
    return runStoreTransaction<T, Tx>(this, key, { fingerprint: options.fingerprint, ttlMs }, work);
  }

  /**
   * Stops the reapers this store started and gives back the connection it keeps for the named locks of a
   * `transactions` library; the pool stays yours to end.
   */
  async close(): Promise<void> {
    const reapers = [...this.#reapers];
    this.#reapers.clear();
    await Promise.all(reapers.map((reaper) => reaper.stop()));
    await this.#transactional.close();
  }

  /** @internal the pool */
  get pool(): Pool {
    return this.#pool;
  }

  /** @internal the statements, for the transactional mode */
  get statements(): Statements {
    return this.#sql;
  }

  /** @internal the library transactions given as `transactions`, if any */
  get transactions(): SqlTransactions<Tx> | undefined {
    return this.#transactions;
  }

  /**
   * @internal Acquire on `run` (the pool, or a transaction's connection). The INSERT ... ON DUPLICATE KEY UPDATE
   * decides; its insert id says whether it took the key (and whether it resumed steps). A runner that cannot see
   * the insert id reads the row's token instead. When the key was not taken, the live record is read; if it has
   * changed since (completed and expired, released), the whole step runs again.
   */
  async acquireOn(
    run: Run,
    key: string,
    { fingerprint, lockTimeoutMs }: AcquireOptions,
    token: string = randomUUID(),
  ): Promise<AcquireResult> {
    for (let attempt = 0; attempt < 10; attempt++) {
      let written: Outcome;
      try {
        written = await run(this.#sql.acquire, [key, fingerprint, token, lockTimeoutMs, lockTimeoutMs]);
      } catch (error) {
        // InnoDB may pick a racing INSERT ... ON DUPLICATE KEY UPDATE as a deadlock victim; it was rolled back whole.
        if (isDeadlock(error)) continue;
        throw error;
      }
      let mark = written.insertId;
      let kept: Record<string, unknown> | undefined;
      if (mark === undefined || mark === ACQUIRE_MARK.resumed) {
        kept = (await run(this.#sql.owner, [key])).rows[0];
        if (kept?.token !== token) mark = ACQUIRE_MARK.held;
        else mark = steps(kept.steps) === null ? ACQUIRE_MARK.acquired : ACQUIRE_MARK.resumed;
      }
      if (mark === ACQUIRE_MARK.acquired) return { status: 'acquired', token };
      if (mark === ACQUIRE_MARK.resumed && kept !== undefined) {
        const resumed = steps(kept.steps) ?? {};
        return { status: 'acquired', token, steps: resumed, fingerprint: String(kept.fingerprint) };
      }
      const row = (await run(this.#sql.live, [key])).rows[0];
      if (row === undefined) continue;
      if (row.s === 'p')
        return {
          status: 'in_progress',
          fingerprint: String(row.fingerprint ?? ''),
          retryAfterMs: Number(row.retry_ms),
        };
      return { status: 'completed', fingerprint: String(row.fingerprint ?? ''), response: toResponse(row) };
    }
    throw new StoreOperationError(
      `oncely/mysql: acquire for key ${JSON.stringify(key)} found no stable answer after 10 attempts`,
    );
  }
}

function positiveInteger(option: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1)
    throw new IdempotencyOptionsError(
      option,
      `must be a positive integer; got ${String(value)}.`,
      'oncely/mysql',
    );
  return value;
}
