/**
 * A store in PostgreSQL for oncely, on `pg` or postgres.js: {@link PostgresStore}, with transactional mode (the
 * record commits with the handler's own writes), a reaper and an outbox; {@link OutboxRelay} and {@link CachedStore}
 * put a cache (a `RedisStore`) in front of it.
 *
 * @module @oncely/postgres
 */
export { transactionClient, transactionSql } from './context';
export {
  CachedStore,
  type CompletedRecordCache,
  OutboxRelay,
  type OutboxRelayOptions,
  type RelayRun,
} from './relay';
export {
  type LibraryTransactionsOption,
  type PgStoreOptions,
  type PostgresJsStoreOptions,
  PostgresStore,
  type PostgresStoreConstructor,
  type PostgresStoreOptions,
  type PostgresStoreTableOptions,
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
} from './store';
