import { randomUUID } from 'node:crypto';
import {
  type AcquireResult,
  CommitOutcomeUnknownError,
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
  commitFailure,
  type IdempotencyRecord,
  openSqlTransaction,
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
  runStoreTransaction,
  type SqlTransactions,
  type StoreTransaction,
  startReaper,
  type TransactionAcquiredResult,
  type TransactionalIdempotencyStore,
  undoAcquire,
} from '@oncely/core/adapter';
import type { Pool, PoolClient } from 'pg';
import type { Sql, TransactionSql } from 'postgres';
import { hold } from './client';
import { type Driver, pgDriver, pgQuery, postgresJsDriver, postgresJsTransactions } from './drivers';
import { completeParams, type Query, toBool, toNumber, toRecord, toResponse, toSteps, toText } from './rows';
import { checkIdentifier, DEFAULT_SCHEMA, DEFAULT_TABLE, type Statements, statements } from './sql';

/** The options every PostgresStore takes, whichever driver it runs on. */
export interface PostgresStoreTableOptions {
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

/** A store on a `pg` Pool. */
export interface PgStoreOptions extends PostgresStoreTableOptions {
  /** A `pg` Pool, yours to end. Each store step is one statement on it. */
  pool: Pool;
  /** Not with `pool`: a store runs on one of `pool` (`pg`) and `sql` (postgres.js). */
  sql?: undefined;
  /** postgres.js only: with `pg`, set `query_timeout` on the Pool. */
  queryTimeout?: undefined;
}

/** A store on postgres.js (the `postgres` package). */
export interface PostgresJsStoreOptions extends PostgresStoreTableOptions {
  /**
   * A postgres.js `Sql` (`postgres(url, options)`), yours to end. Each store step is one statement on it; in
   * transactional mode each key's transaction is a `sql.begin`, and the handler gets its `TransactionSql`.
   */
  sql: Sql;
  /** Not with `sql`: a store runs on one of `pool` (`pg`) and `sql` (postgres.js). */
  pool?: undefined;
  /**
   * How long a store statement may go without an answer before it fails the store step (a request not yet run gets
   * `503`), as `pg`'s `query_timeout` does (postgres.js has no client-side timeout of its own): milliseconds, or
   * e.g. `'2s'`. It bounds each store statement (`migrate()` and the reaper's too), and in transactional mode the
   * wait for a connection, BEGIN and ROLLBACK; a store statement that times out inside a transaction makes it roll
   * back. The COMMIT is not bounded: what the answer says depends on whether it happened. Not the handler's own
   * statements, nor a library's transactions given as `transactions`. A statement that timed out may still run when
   * a hung server resumes (a key it reserved is released behind it). Keep it above `statement_timeout`, so that a
   * slow server is cancelled by the server and only a silent one by the client. Default: none (a hung server holds
   * requests until it answers).
   */
  queryTimeout?: Duration;
}

/** Transactional mode through another library: see `transactions`. */
export interface LibraryTransactionsOption<Tx> {
  /**
   * Transactional mode through your database library (an ORM, a query builder): the store opens each key's
   * transaction with it, runs its own statements in that transaction, and hands the handler the library's own
   * transaction object as `db`, so the handler writes as it always does. `@oncely/orm` has one per ORM. Without
   * it, the transaction is a `pg` client of `pool`, or a postgres.js `TransactionSql` of `sql`.
   */
  transactions: SqlTransactions<Tx>;
}

/**
 * The options of a PostgresStore: exactly one of `pool` (`pg`) and `sql` (postgres.js), and optionally
 * `transactions`; `Tx` is the type of the transaction the handler gets.
 */
export type PostgresStoreOptions<Tx = PoolClient> = (PgStoreOptions | PostgresJsStoreOptions) &
  Partial<LibraryTransactionsOption<Tx>>;

export type { PurgeOptions, Reaper, ReaperOptions } from '@oncely/core/adapter';

const SQLSTATE = /^[0-9A-Z]{5}$/;

/**
 * Whether `error` is one PostgreSQL sent (`pg`'s DatabaseError, postgres.js's PostgresError: a SQLSTATE and a
 * severity; Prisma's driver adapter keeps the SQLSTATE as `originalCode`), not one of the client's own (a lost
 * connection, a timeout).
 */
function isServerError(error: object): boolean {
  const { code, severity, originalCode } = error as {
    code?: unknown;
    severity?: unknown;
    originalCode?: unknown;
  };
  if (typeof originalCode === 'string') return SQLSTATE.test(originalCode);
  return typeof code === 'string' && SQLSTATE.test(code) && typeof severity === 'string';
}

/** What the store throws for a failed COMMIT of `key`: see `commitFailure`. */
function commitFailed(key: string, error: unknown): unknown {
  return commitFailure(error, { library: 'oncely/postgres', key, isServerError });
}

function queryTimeoutOption(value: Duration | undefined): number | undefined {
  if (value === undefined) return undefined;
  let ms = Number.NaN;
  try {
    ms = parseDuration(value);
  } catch {}
  // Node runs a timer longer than 2^31 - 1 ms after 1 ms: every statement would time out.
  if (!(ms >= 1 && ms <= 2 ** 31 - 1))
    throw new IdempotencyOptionsError(
      'queryTimeout',
      `must be a duration from 1 ms to 24 days (a number of milliseconds, or e.g. '2s'), or left out for none; got ${JSON.stringify(value)}.`,
      'oncely/postgres',
    );
  return ms;
}

/**
 * A store in PostgreSQL: records live in one table, keyed by the idempotency key. Each step is one statement
 * (acquire reads the live record first, so a replay is a plain read; only when there is none does it run an
 * INSERT ... ON CONFLICT ... DO UPDATE ... WHERE the record is dead, which alone decides who owns the key), and
 * every time comes from the database's clock. With `transactional: true` on the adapter (or
 * `store.transaction()` for consumers), the record is written in the same transaction as the handler's own writes.
 */
class PostgresStoreImpl<Tx = PoolClient> implements TransactionalIdempotencyStore {
  readonly #driver: Driver;
  readonly #pool: Pool | undefined;
  readonly #query: Query;
  readonly #transactions: SqlTransactions<Tx> | undefined;
  readonly #sql: Statements;
  readonly #outbox: boolean;
  readonly #lockSpace: string;

  constructor(options: PostgresStoreOptions<Tx>) {
    const hasPool = typeof options?.pool?.query === 'function';
    const hasSql = typeof options?.sql?.unsafe === 'function';
    if (hasPool === hasSql) {
      throw new IdempotencyOptionsError(
        'pool',
        `${hasPool ? 'and "sql" were both given' : 'or "sql" is required'}: pass exactly one, new PostgresStore({ pool: new pg.Pool() }) for pg or new PostgresStore({ sql: postgres() }) for postgres.js.`,
        'oncely/postgres',
      );
    }
    const schema = checkIdentifier('schema', options.schema ?? DEFAULT_SCHEMA);
    const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE);
    if (table.length > 55)
      throw new IdempotencyOptionsError('table', 'must be at most 55 characters.', 'oncely/postgres');
    const transactions = options.transactions;
    if (transactions !== undefined) {
      if (
        transactions === null ||
        typeof transactions.run !== 'function' ||
        typeof transactions.query !== 'function'
      )
        throw new IdempotencyOptionsError(
          'transactions',
          'must be a SqlTransactions ({ dialect, run, query }), such as one of @oncely/orm.',
          'oncely/postgres',
        );
      if (transactions.dialect !== 'postgres')
        throw new IdempotencyOptionsError(
          'transactions',
          `is for ${JSON.stringify(transactions.dialect)}; PostgresStore needs one for 'postgres'.`,
          'oncely/postgres',
        );
    }
    if (options.pool !== undefined) {
      if (options.queryTimeout !== undefined)
        throw new IdempotencyOptionsError(
          'queryTimeout',
          'is for postgres.js; with pg, set query_timeout on the Pool (new pg.Pool({ query_timeout: 2000 })).',
          'oncely/postgres',
        );
      this.#pool = options.pool;
      this.#driver = pgDriver(options.pool);
      this.#transactions = transactions;
    } else {
      const sql = options.sql as Sql;
      const timeoutMs = queryTimeoutOption(options.queryTimeout);
      this.#driver = postgresJsDriver(sql, timeoutMs);
      // postgres.js has no client to hand out: its own transactions are callbacks, like an ORM's.
      this.#transactions =
        transactions ?? (postgresJsTransactions(sql, timeoutMs) as unknown as SqlTransactions<Tx>);
    }
    this.#query = this.#driver.query;
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
   * `outbox: true`. Upgrades a table made by an earlier version in place: adds the `steps` and `keep_until`
   * columns if they are missing (no table rewrite). Safe to run twice, and concurrently.
   */
  async migrate(): Promise<void> {
    await this.#driver.inTransaction(async (query) => {
      // Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog: serialise migrations.
      await query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`${this.#lockSpace}migrate`]);
      for (const statement of this.#sql.migrate) await query(statement, []);
      if (this.#outbox) for (const statement of this.#sql.migrateOutbox) await query(statement, []);
    });
  }

  async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    const token = randomUUID();
    try {
      return await this.#acquireOn(this.#query, key, options, token);
    } catch (error) {
      // A timed-out acquire may still run when a paused server resumes: release its lease behind it (fenced by the
      // token, retried until it lands or the lease lapses), so the key is not blocked for lockTimeout.
      undoAcquire(
        async () => (await this.#query(this.#sql.release, [key, token])).rowCount === 1,
        options.lockTimeoutMs,
      );
      throw error;
    }
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const sql = this.#outbox ? this.#sql.completeWithOutbox : this.#sql.complete;
    return (await this.#query(sql, completeParams(key, token, response, ttlMs))).rowCount === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.#query(this.#sql.release, [key, token])).rowCount === 1;
  }

  /**
   * Records a step's result in the record's `steps` column, one UPDATE fenced like `complete`. From then on the
   * record outlives its lease as `released` (until `ttlMs` after its latest step, or its lease's end if later),
   * and the next `acquire` resumes it.
   */
  async recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    return (await this.#query(this.#sql.recordStep, [key, token, name, value, ttlMs])).rowCount === 1;
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    return (await this.#query(this.#sql.renew, [key, token, lockTimeoutMs])).rowCount === 1;
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const row = (await this.#query(this.#sql.get, [key])).rows[0];
    return row === undefined ? undefined : toRecord(row);
  }

  async delete(key: string): Promise<boolean> {
    const { rows } = await this.#query(this.#sql.delete, [key]);
    return toBool(rows[0]?.live);
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
    if (this.#transactions !== undefined || this.#pool === undefined)
      return this.#acquireInLibraryTransaction(this.#transactions as SqlTransactions<Tx>, key, options);
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
      if (!toBool(rows[0]?.locked)) {
        await done(true);
        return { status: 'in_progress', fingerprint: options.fingerprint, retryAfterMs: 1000 };
      }
      // After the lock, a fresh statement (and snapshot): a record committed before we got the lock is seen.
      const result = await this.#acquireOn(pgQuery(client), key, options);
      if (result.status !== 'acquired') {
        await done(true);
        return result;
      }
      const { token, steps, fingerprint } = result;
      const sql = this.#outbox ? this.#sql.completeInTransactionWithOutbox : this.#sql.completeInTransaction;
      let settled = false;
      const transaction: StoreTransaction = {
        db: client,
        commit: async (response, ttlMs) => {
          if (settled) return false;
          settled = true;
          try {
            const updated = await client.query(sql, completeParams(key, token, response, ttlMs));
            if (updated.rowCount !== 1) {
              await done(true);
              return false;
            }
            try {
              await client.query('COMMIT');
            } catch (error) {
              // An error the server sent (a SQLSTATE: a deferred constraint, a serialization failure) means it
              // rolled back. Any other (no answer within query_timeout, the connection lost): it may have committed.
              const failure = commitFailed(key, error);
              if (failure instanceof CommitOutcomeUnknownError) await done(true, error); // destroyed, no ROLLBACK
              throw failure;
            }
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
      // A record taken over with steps keeps its fingerprint: passed on, for the engine to refuse a mismatch.
      return steps === undefined
        ? { status: 'acquired', token, transaction }
        : { status: 'acquired', token, transaction, steps, fingerprint };
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
    work: (tx: Tx) => Promise<T>,
  ): Promise<{ outcome: 'executed' | 'replayed'; result: T }> {
    const ttlMs = parseDuration(options.ttl ?? '24h');
    return runStoreTransaction<T, Tx>(this, key, { fingerprint: options.fingerprint, ttlMs }, work);
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
      const deleted = (await this.#query(this.#sql.purge, [batchSize])).rowCount;
      total += deleted;
      if (deleted < batchSize) break;
    }
    return total;
  }

  /** Runs `purgeExpired` every `interval` (timer `unref`'d, one run at a time) until `stop()`. */
  startReaper(options: ReaperOptions = {}): Reaper {
    return startReaper((purge) => this.purgeExpired(purge), options);
  }

  /** @internal whether completions are queued in the outbox (`outbox: true`) */
  get queuesOutbox(): boolean {
    return this.#outbox;
  }

  /** @internal the relay's view of the outbox */
  get statements(): Statements {
    return this.#sql;
  }

  /** @internal a transaction of the store's own, on its driver (the relay's) */
  inOwnTransaction<T>(work: (query: Query) => Promise<T>): Promise<T> {
    return this.#driver.inTransaction(work);
  }

  /**
   * Transactional mode through `transactions`: the same steps as on a `pg` client (advisory lock tried, key
   * reserved, completion written at commit), each statement run in the library's transaction.
   */
  async #acquireInLibraryTransaction(
    transactions: SqlTransactions<Tx>,
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult> {
    const open = await openSqlTransaction(transactions);
    const query: Query = (statement, params) => transactions.query(open.tx, statement, params);
    try {
      const { rows } = await query(this.#sql.tryLock, [this.#lockSpace + key]);
      if (!toBool(rows[0]?.locked)) {
        await open.end(false);
        return { status: 'in_progress', fingerprint: options.fingerprint, retryAfterMs: 1000 };
      }
      const result = await this.#acquireOn(query, key, options);
      if (result.status !== 'acquired') {
        await open.end(false);
        return result;
      }
      const { token, steps, fingerprint } = result;
      const sql = this.#outbox ? this.#sql.completeInTransactionWithOutbox : this.#sql.completeInTransaction;
      let settled = false;
      const transaction: StoreTransaction = {
        db: open.tx,
        commit: async (response, ttlMs) => {
          if (settled) return false;
          settled = true;
          let updated: number;
          try {
            updated = (await query(sql, completeParams(key, token, response, ttlMs))).rowCount;
          } catch (error) {
            await open.end(false);
            throw error;
          }
          if (updated !== 1) {
            await open.end(false);
            return false;
          }
          try {
            await open.end(true);
          } catch (error) {
            throw commitFailed(key, error);
          }
          return true;
        },
        rollback: async () => {
          if (settled) return;
          settled = true;
          await open.end(false);
        },
      };
      return steps === undefined
        ? { status: 'acquired', token, transaction }
        : { status: 'acquired', token, transaction, steps, fingerprint };
    } catch (error) {
      await open.end(false);
      throw error;
    }
  }

  async #acquireOn(
    query: Query,
    key: string,
    { fingerprint, lockTimeoutMs }: AcquireOptions,
    token: string = randomUUID(),
  ): Promise<AcquireResult> {
    // An empty answer means the row appeared after this statement's snapshot (its read saw no live record, its
    // INSERT met one): run it again with a fresh snapshot, whose read sees that row.
    for (let attempt = 0; attempt < 10; attempt++) {
      const { rows } = await query(this.#sql.acquire, [key, fingerprint, token, lockTimeoutMs]);
      const row = rows[0];
      if (row === undefined) continue;
      const s = toText(row.s);
      if (s === 'a') {
        const steps = toSteps(row.steps);
        return steps === null
          ? { status: 'acquired', token }
          : { status: 'acquired', token, steps, fingerprint: toText(row.fingerprint) ?? fingerprint };
      }
      if (s === 'p')
        return {
          status: 'in_progress',
          fingerprint: toText(row.fingerprint) ?? '',
          retryAfterMs: toNumber(row.retryms),
        };
      return { status: 'completed', fingerprint: toText(row.fingerprint) ?? '', response: toResponse(row) };
    }
    throw new StoreOperationError(
      `oncely/postgres: acquire for key ${JSON.stringify(key)} found no stable answer after 10 attempts`,
    );
  }
}

/**
 * A PostgresStore's constructor: the type of the transaction handed to handlers follows from the options, a `pg`
 * `PoolClient` for `pool`, a postgres.js `TransactionSql` for `sql`, or the library's own with `transactions`.
 */
export interface PostgresStoreConstructor {
  /**
   * A store whose transactional mode runs through your database library (`transactions`): handlers get its
   * transaction object.
   * Throws `IdempotencyOptionsError` when an option is missing or wrong.
   */
  new <Tx>(
    options: (PgStoreOptions | PostgresJsStoreOptions) & LibraryTransactionsOption<Tx>,
  ): PostgresStoreImpl<Tx>;
  /**
   * A store on a `pg` Pool: in transactional mode, handlers get a `PoolClient` of it.
   * Throws `IdempotencyOptionsError` when an option is missing or wrong.
   */
  new (options: PgStoreOptions & { transactions?: undefined }): PostgresStoreImpl<PoolClient>;
  /**
   * A store on postgres.js: in transactional mode, handlers get the `TransactionSql` of `sql.begin`.
   * Throws `IdempotencyOptionsError` when an option is missing or wrong.
   */
  new (options: PostgresJsStoreOptions & { transactions?: undefined }): PostgresStoreImpl<TransactionSql>;
  /** The prototype of every PostgresStore, so that `instanceof PostgresStore` works. */
  readonly prototype: PostgresStoreImpl<unknown>;
}

/**
 * A store in PostgreSQL, on `pg` (`pool`) or postgres.js (`sql`).
 * `Tx` is the transaction a handler gets in transactional mode.
 */
export type PostgresStore<Tx = PoolClient> = PostgresStoreImpl<Tx>;
/**
 * Makes a store in PostgreSQL: `new PostgresStore({ pool })` on `pg`, `new PostgresStore({ sql })` on postgres.js,
 * with `transactions` for transactional mode through another library. Create its table with `migrate()`.
 */
export const PostgresStore = PostgresStoreImpl as PostgresStoreConstructor;
