/**
 * Transactional mode through TypeORM: oncely's statements run in a TypeORM transaction, so that a handler writing
 * with the `EntityManager` it is handed commits together with the idempotency record.
 * {@link typeormTransactions} makes the `transactions` option of a `PostgresStore` or `MySQLStore`.
 *
 * @module @oncely/orm/typeorm
 */
import { IdempotencySetupError } from '@oncely/core';
import { transactionOfRequest } from '@oncely/core/adapter';
import type { DataSource, EntityManager } from 'typeorm';
import { type OrmTransactions, ormTransactions, type TransactionalRequest } from '../shared';

/** TypeORM's isolation levels that PostgreSQL and MySQL both have. */
export type TypeormIsolationLevel =
  | 'READ UNCOMMITTED'
  | 'READ COMMITTED'
  | 'REPEATABLE READ'
  | 'SERIALIZABLE';

/** Options of {@link typeormTransactions}. */
export interface TypeormTransactionsOptions {
  /**
   * The isolation level of the transactions oncely opens (the handler's writes run in them). Default: the
   * database's own (READ COMMITTED on PostgreSQL, REPEATABLE READ on MySQL and MariaDB).
   */
  isolationLevel?: TypeormIsolationLevel;
}

function dialectOf(dataSource: DataSource): 'postgres' | 'mysql' {
  const type = dataSource.options.type;
  if (type === 'postgres') return 'postgres';
  if (type === 'mysql' || type === 'mariadb') return 'mysql';
  throw new IdempotencySetupError(
    `typeormTransactions: data source type '${type}' is not supported; use 'postgres', 'mysql' or 'mariadb'.`,
  );
}

/**
 * Lets oncely's SQL stores hold a key inside a TypeORM transaction: the handler gets the transaction's
 * `EntityManager` and writes through it (repositories, `save`, query builders) as usual, and the completed record
 * commits with those writes. Pass the result as the store's `transactions`; the store runs on the same database as
 * `dataSource` (type `postgres`, `mysql` or `mariadb`), which must be initialized before the first request.
 *
 * @example
 * const store = new PostgresStore({ pool, transactions: typeormTransactions(dataSource) });
 */
export function typeormTransactions(
  dataSource: DataSource,
  options: TypeormTransactionsOptions = {},
): OrmTransactions<EntityManager> {
  const dialect = dialectOf(dataSource);
  const { isolationLevel } = options;
  return ormTransactions('@oncely/orm/typeorm', {
    dialect,
    async run(work) {
      const inTransaction = async (manager: EntityManager) => {
        await work(manager);
      };
      if (isolationLevel === undefined) await dataSource.transaction(inTransaction);
      else await dataSource.transaction(isolationLevel, inTransaction);
    },
    async query(manager, statement, params) {
      const runner = manager.queryRunner;
      if (runner === undefined) {
        throw new IdempotencySetupError('typeormTransactions: this EntityManager is not a transaction’s.');
      }
      // The structured result keeps the row count that `manager.query` drops for an INSERT on PostgreSQL (it gives
      // `[rows, count]` only for UPDATE and DELETE there, and a ResultSetHeader on MySQL).
      const result = await runner.query(statement, [...params], true);
      const rows = (result.records ?? []) as Record<string, unknown>[];
      return { rows, rowCount: result.affected ?? rows.length };
    },
  });
}

/**
 * The request's transaction in transactional mode, as EntityManager: the same as `transactions.transactionOf(req)`, for
 * handlers in modules that do not see `transactions`. Throws `IdempotencySetupError` if the request has none.
 */
export function transactionOf(request: TransactionalRequest): EntityManager {
  return transactionOfRequest<EntityManager>(request, '@oncely/orm/typeorm');
}
