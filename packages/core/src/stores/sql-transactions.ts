import { IdempotencySetupError } from '../shared/errors';

/** One statement's answer, whatever library ran it. */
export interface SqlResult {
  /** The rows a SELECT (or RETURNING) gave, as the library decoded them; `[]` for other statements. */
  rows: Record<string, unknown>[];
  /** Rows an INSERT, UPDATE or DELETE changed (MySQL: affected rows); the number of rows for a SELECT. */
  rowCount: number;
}

/**
 * What a SQL store needs from a database library (an ORM, a query builder, a driver) to hold a key inside that
 * library's own transaction, so that the handler writes through the library as it always does and the completed
 * record commits with its writes. `@oncely/orm` has one per ORM; the stores take one as `transactions`.
 */
export interface SqlTransactions<Tx> {
  /** The database the library talks to; a store refuses, at construction, a library for another database. */
  readonly dialect: 'postgres' | 'mysql';
  /**
   * Runs `work` in a new transaction of the library: commits when `work` resolves, rolls back when it rejects,
   * and resolves or rejects as the library's transaction did.
   */
  run(work: (tx: Tx) => Promise<void>): Promise<void>;
  /**
   * Runs one statement on `tx`. The statement uses the database's own placeholders (`$1` on PostgreSQL, where one
   * parameter may appear several times; `?` on MySQL), and `params` are strings, numbers, `null` or Buffers.
   */
  query(tx: Tx, statement: string, params: readonly unknown[]): Promise<SqlResult>;
}

/** A transaction opened through `SqlTransactions.run`, held open until `end`. */
export interface OpenSqlTransaction<Tx> {
  /** The library's transaction, to run statements on. */
  readonly tx: Tx;
  /**
   * Ends the transaction: commits (`true`) or rolls back (`false`), and resolves once the library has finished.
   * A commit rejects with the library's error if it failed (see `commitFailure` for what it means); a rollback
   * never rejects.
   */
  end(commit: boolean): Promise<void>;
}

/** Thrown out of `run`'s work to make the library roll back; never seen outside `openSqlTransaction`. */
class RollbackRequested extends Error {}

/**
 * Opens a transaction through a library whose transactions are callbacks (`db.transaction(async (tx) => ...)`)
 * and hands it back open, so a store can reserve the key in it, let the handler run, then commit or roll back.
 * Rejects with the library's error if the transaction could not begin.
 */
export function openSqlTransaction<Tx>(transactions: SqlTransactions<Tx>): Promise<OpenSqlTransaction<Tx>> {
  return new Promise((resolveOpen, rejectOpen) => {
    let decide: (commit: boolean) => void = () => {};
    const decided = new Promise<boolean>((resolve) => {
      decide = resolve;
    });
    let opened = false;
    const finished: Promise<void> = Promise.resolve()
      .then(() =>
        transactions.run(async (tx) => {
          opened = true;
          resolveOpen({
            tx,
            end: async (commit) => {
              decide(commit);
              if (commit) await finished;
              else await finished.catch(() => {});
            },
          });
          if (!(await decided)) throw new RollbackRequested('rollback');
        }),
      )
      .then(() => {
        // A `run` that resolved without calling its work would otherwise leave the store waiting forever.
        if (!opened)
          throw new IdempotencySetupError(
            'SqlTransactions.run resolved without running its work in a transaction.',
          );
      })
      .catch((error: unknown) => {
        if (error instanceof RollbackRequested) return;
        if (!opened) rejectOpen(error);
        throw error;
      });
    // Nobody may await `finished` (a transaction the caller rolled back, one that failed to begin).
    finished.catch(() => {});
  });
}

/**
 * The transaction a covered request holds in transactional mode (`req.idempotency.db` and each adapter's
 * equivalent), as the library's own type. Throws if the request is not covered or not transactional, rather than
 * let the handler's writes escape the transaction silently.
 */
export function transactionOfRequest<Tx>(
  request: { idempotency?: { db: unknown } | undefined },
  library: string,
): Tx {
  const db = request.idempotency?.db;
  if (db === undefined || db === null) {
    throw new IdempotencySetupError(
      `${library}: this request has no idempotency transaction; use transactional: true on the adapter with a store given \`transactions\`, and send an Idempotency-Key.`,
    );
  }
  return db as Tx;
}
