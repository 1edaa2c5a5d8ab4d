/**
 * A store in MySQL or MariaDB for oncely, over mysql2: {@link MySQLStore}, with fenced leases, transactional mode
 * (the record commits with the handler's own writes) and a reaper.
 *
 * @module @oncely/mysql
 */
export {
  MySQLStore,
  type MySQLStoreOptions,
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
} from './store';
export { QueryTimeoutError, withQueryTimeout } from './timeouts';
export { transactionConnection } from './transaction';
