import { CommitOutcomeUnknownError } from '@oncely/core';
import {
  type AcquireOptions,
  type AcquireResult,
  type CompletedResult,
  commitFailure,
  type InProgressResult,
  openSqlTransaction,
  type SqlTransactions,
  type StoreTransaction,
  type TransactionAcquiredResult,
  transactionOfRequest,
} from '@oncely/core/adapter';
import type { Pool, PoolConnection } from 'mysql2/promise';
import { completeParams } from './rows';
import type { Statements } from './sql';
import { type Run, runOn } from './store';

/**
 * Transactional mode of MySQLStore. Who may run a key is decided by a named lock, `GET_LOCK(name, 0)`, tried and
 * never waited for, so a duplicate of a running transaction learns "in progress" at once. The lock only makes the
 * answer prompt: the key's row is what keeps two transactions from both running it (the acquire's INSERT ... ON
 * DUPLICATE KEY UPDATE holds the row's exclusive lock until COMMIT or ROLLBACK, and a second one waits on it and
 * then sees the committed record). docs/stores/mysql.md, "Transactional mode", lists the locks each statement takes.
 */

/** The named lock of a key: server-wide, so the database and the table join the key; SHA-1 keeps it under 64. */
const LOCK_NAME = "CONCAT('oncely:', SHA1(CONCAT_WS(CHAR(0 USING binary), COALESCE(DATABASE(), ''), ?, ?)))";
const TRY_LOCK = `SELECT GET_LOCK(${LOCK_NAME}, 0) AS locked`;
const UNLOCK = `SELECT RELEASE_LOCK(${LOCK_NAME}) AS released`;

/** What a duplicate of a running transaction is told to wait before it tries again. */
const BUSY_RETRY_MS = 1000;
/** Acquires run again after a deadlock (each in a new transaction) before the key is answered "in progress". */
const DEADLOCK_ATTEMPTS = 3;
const ER_LOCK_WAIT_TIMEOUT = 1205;
const ER_LOCK_DEADLOCK = 1213;

/** What transactional mode needs from the store. */
export interface TransactionHost<Tx> {
  readonly pool: Pool;
  readonly statements: Statements;
  readonly transactions: SqlTransactions<Tx> | undefined;
  acquireOn(run: Run, key: string, options: AcquireOptions): Promise<AcquireResult>;
}

type TransactionAcquire = TransactionAcquiredResult | InProgressResult | CompletedResult;

/**
 * InnoDB rolls back the whole transaction of a deadlock victim, and the session's next statement would run outside
 * any transaction (autocommit): so the acquire's own statements never retry one inside it. This error carries no
 * errno, and the acquire starts over in a new transaction.
 */
class LockConflict extends Error {
  constructor(
    readonly deadlock: boolean,
    options: { cause: unknown },
  ) {
    super('oncely/mysql: lock conflict in the acquire', options);
  }
}

function errnoOf(error: unknown): unknown {
  return (error as { errno?: unknown } | null)?.errno;
}

/**
 * Whether `error` is one the server sent: a server error number (Prisma's driver adapter keeps it as
 * `originalCode`), not a client's own: mysql2's lost connection or timeout (no number, or a negative system one),
 * a C client's `CR_` range (2000-2999), MariaDB Connector/Node's own (45000 and up).
 */
function isServerError(error: object): boolean {
  const { errno, originalCode } = error as { errno?: unknown; originalCode?: unknown };
  const number = typeof originalCode === 'string' ? Number(originalCode) : errno;
  return (
    typeof number === 'number' &&
    Number.isInteger(number) &&
    number >= 1000 &&
    number < 45_000 &&
    !(number >= 2000 && number < 3000)
  );
}

/** mysql2 marks an error that closed the connection `fatal`: no ROLLBACK is sent on it. */
function isFatal(error: unknown): boolean {
  return (error as { fatal?: unknown } | null)?.fatal === true;
}

function guarded(run: Run): Run {
  return async (statement, params) => {
    try {
      return await run(statement, params);
    } catch (error) {
      const errno = errnoOf(error);
      if (errno === ER_LOCK_DEADLOCK || errno === ER_LOCK_WAIT_TIMEOUT)
        throw new LockConflict(errno === ER_LOCK_DEADLOCK, { cause: error });
      throw error;
    }
  };
}

/** One transaction holding the key: on the store's connection, or one of the library given as `transactions`. */
interface Session {
  readonly db: unknown;
  readonly run: Run;
  /** COMMIT; rejects if it failed (with the driver's or library's error, for `commitFailure` to read). */
  commit(): Promise<void>;
  /** ROLLBACK, never rejecting; false if the connection is not fit for reuse (the ROLLBACK failed or was skipped). */
  abort(failure?: unknown): Promise<boolean>;
}

/** A held key: begins transactions on it, and frees it (and what holds it) once. */
interface Holder {
  begin(): Promise<Session>;
  /** Never rejects; `broken`: the transaction's connection (the store's own) is unusable, and is destroyed. */
  release(broken: boolean): Promise<void>;
}

/** Reads the single 0/1/NULL a lock function returned. */
async function lockCall(run: Run, statement: string, table: string, key: string): Promise<boolean> {
  const { rows } = await run(statement, [table, key]);
  return Number(Object.values(rows[0] ?? {})[0]) === 1;
}

export class TransactionalMode<Tx> {
  readonly #host: TransactionHost<Tx>;
  /**
   * Library path: the connection of the store's pool that holds the named locks (checked out once, kept until
   * `close`), never the library's own: the library's connection goes back to its pool after its commit, and a lock
   * left on it (a transaction the library timed out, such as Prisma's interactive transaction `timeout`) would
   * answer 409 for the key for as long as that connection lives. One connection, not one per transaction, so that
   * a library on the same pool can never wait for a connection while every connection waits for it.
   */
  #lockConnection: Promise<PoolConnection> | undefined;
  /** Library path: named locks are re-entrant in a session, so the keys held through the lock connection. */
  readonly #held = new Set<string>();

  constructor(host: TransactionHost<Tx>) {
    this.#host = host;
  }

  async acquire(key: string, options: AcquireOptions): Promise<TransactionAcquire> {
    const busy: InProgressResult = {
      status: 'in_progress',
      fingerprint: options.fingerprint,
      retryAfterMs: BUSY_RETRY_MS,
    };
    const transactions = this.#host.transactions;
    const holder =
      transactions === undefined ? await this.#holdOwn(key) : await this.#holdShared(key, transactions);
    if (holder === undefined) return busy;
    let broken = false;
    try {
      for (let attempt = 1; ; attempt++) {
        const session = await holder.begin();
        let result: AcquireResult;
        try {
          result = await this.#host.acquireOn(guarded(session.run), key, options);
        } catch (error) {
          broken = !(await session.abort(error));
          if (!(error instanceof LockConflict)) throw error;
          // A deadlock rolled the acquire back: run it again. A lock wait that timed out (a row held by a session
          // without the named lock: a plain-mode acquire on the same key) is answered "in progress".
          if (error.deadlock && attempt < DEADLOCK_ATTEMPTS && !broken) continue;
          await holder.release(broken);
          return busy;
        }
        if (result.status !== 'acquired') {
          await holder.release(!(await session.abort()));
          return result;
        }
        const transaction = this.#transaction(key, result.token, session, holder);
        // A record taken over with steps keeps its fingerprint: passed on, for the engine to refuse a mismatch.
        return result.steps === undefined
          ? { status: 'acquired', token: result.token, transaction }
          : {
              status: 'acquired',
              token: result.token,
              transaction,
              steps: result.steps,
              fingerprint: result.fingerprint ?? options.fingerprint,
            };
      }
    } catch (error) {
      await holder.release(broken || isFatal(error));
      throw error;
    }
  }

  /** Gives back the lock connection of the library path (the server frees the locks it held). */
  async close(): Promise<void> {
    const pending = this.#lockConnection;
    this.#lockConnection = undefined;
    if (pending === undefined) return;
    try {
      (await pending).destroy();
    } catch {
      // It was never checked out.
    }
  }

  #transaction(key: string, token: string, session: Session, holder: Holder): StoreTransaction {
    let settled = false;
    const finish = async (failure?: unknown): Promise<void> => {
      await holder.release(!(await session.abort(failure)));
    };
    return {
      db: session.db,
      commit: async (response, ttlMs) => {
        if (settled) return false;
        settled = true;
        try {
          const { matched } = await session.run(
            this.#host.statements.completeInTransaction,
            completeParams(key, token, response, ttlMs),
          );
          if (matched !== 1) {
            await finish();
            return false;
          }
        } catch (error) {
          await finish(error);
          throw error;
        }
        try {
          await session.commit();
        } catch (error) {
          // An error the server sent means it rolled back (the ROLLBACK only ends the session's transaction state).
          // Any other (no answer: the connection lost, a timeout) may hide a commit: no ROLLBACK on that connection.
          const failure = commitFailure(error, { library: 'oncely/mysql', key, isServerError });
          if (failure instanceof CommitOutcomeUnknownError) await holder.release(true);
          else await finish(error);
          throw failure;
        }
        await holder.release(false);
        return true;
      },
      rollback: async () => {
        if (settled) return;
        settled = true;
        await finish();
      },
    };
  }

  /**
   * The store's own path: the named lock and the transaction on one connection of the store's pool, so they end
   * together (a connection that dies takes both: the server rolls the transaction back and frees the lock). The lock
   * is freed after the COMMIT or ROLLBACK, before the connection goes back to the pool.
   */
  async #holdOwn(key: string): Promise<Holder | undefined> {
    const table = this.#host.statements.table;
    const connection = await this.#host.pool.getConnection();
    const run = runOn(connection);
    try {
      if (!(await lockCall(run, TRY_LOCK, table, key))) {
        connection.release();
        return undefined;
      }
    } catch (error) {
      connection.destroy();
      throw error;
    }
    let released = false;
    return {
      begin: async () => {
        await connection.query('START TRANSACTION');
        return {
          db: connection,
          run,
          commit: async () => {
            await connection.query('COMMIT');
          },
          abort: async (failure) => {
            if (isFatal(failure)) return false;
            try {
              await connection.query('ROLLBACK');
              return true;
            } catch {
              return false;
            }
          },
        };
      },
      release: async (broken) => {
        if (released) return;
        released = true;
        if (!broken) {
          try {
            await lockCall(run, UNLOCK, table, key);
            connection.release();
            return;
          } catch {
            // Destroyed below: the server frees the lock of a session it loses.
          }
        }
        connection.destroy();
      },
    };
  }

  /** The library path: the key's lock on the store's lock connection, the transaction in the library. */
  async #holdShared(key: string, transactions: SqlTransactions<Tx>): Promise<Holder | undefined> {
    if (this.#held.has(key)) return undefined;
    const table = this.#host.statements.table;
    this.#held.add(key);
    try {
      if (!(await this.#onLockConnection((run) => lockCall(run, TRY_LOCK, table, key)))) {
        this.#held.delete(key);
        return undefined;
      }
    } catch (error) {
      this.#held.delete(key);
      throw error;
    }
    let released = false;
    return {
      begin: async () => {
        const open = await openSqlTransaction(transactions);
        return {
          db: open.tx,
          run: async (statement, params) => {
            const { rows, rowCount } = await transactions.query(open.tx, statement, params);
            return { rows, matched: rowCount };
          },
          commit: () => open.end(true),
          // The library's own ROLLBACK (its transaction must end, or its connection stays checked out).
          abort: async () => {
            await open.end(false);
            return true;
          },
        };
      },
      release: async () => {
        if (released) return;
        released = true;
        try {
          await this.#onLockConnection((run) => lockCall(run, UNLOCK, table, key), false);
        } catch {
          // The lock connection failed and was destroyed: the server freed its locks.
        } finally {
          this.#held.delete(key);
        }
      },
    };
  }

  /**
   * Runs `use` on the lock connection, checking one out if there is none. A connection that fails is destroyed (its
   * locks go with it: the transactions holding them still hold their rows, and a duplicate waits on the row instead
   * of being told at once) and, with `retry`, `use` runs once more on a new one.
   */
  async #onLockConnection<T>(use: (run: Run) => Promise<T>, retry = true): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      this.#lockConnection ??= this.#host.pool.getConnection();
      const pending = this.#lockConnection;
      let connection: PoolConnection;
      try {
        connection = await pending;
      } catch (error) {
        if (this.#lockConnection === pending) this.#lockConnection = undefined;
        throw error;
      }
      try {
        return await use(runOn(connection));
      } catch (error) {
        if (this.#lockConnection === pending) {
          this.#lockConnection = undefined;
          connection.destroy();
        }
        if (!retry || attempt > 1 || !isFatal(error)) throw error;
      }
    }
  }
}

/**
 * The transaction of a request in transactional mode (`req.idempotency.db` and each adapter's equivalent), typed:
 * the `mysql2` PoolConnection of the transaction, or, for a store given `transactions`, that library's transaction
 * object (name its type: `transactionConnection<MyTx>(req)`). Throws if the request is not covered or the adapter
 * is not `transactional: true`, rather than let the handler's writes escape the transaction silently.
 */
export function transactionConnection<Tx = PoolConnection>(request: {
  idempotency?: { db: unknown } | undefined;
}): Tx {
  return transactionOfRequest<Tx>(request, 'oncely/mysql');
}
