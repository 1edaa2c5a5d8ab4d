export { transactionClient } from './context';
export {
  CachedStore,
  type CompletedRecordCache,
  OutboxRelay,
  type OutboxRelayOptions,
  type RelayRun,
} from './relay';
export {
  PostgresStore,
  type PostgresStoreOptions,
  type PurgeOptions,
  type Reaper,
  type ReaperOptions,
} from './store';
