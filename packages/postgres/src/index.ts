export { transactionClient } from './context';
export {
  PostgresStore,
  type PostgresStoreOptions,
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
  TransactionInProgressError,
  TransactionMismatchError,
} from './store';
