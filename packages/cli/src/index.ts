/**
 * The `oncely` command, to inspect, delete, list and count a store's idempotency records (its bin), and
 * {@link main} to run it in-process (tests, wrappers), with the {@link Backend} interface its stores implement.
 *
 * @module @oncely/cli
 */
export type {
  Backend,
  BackendFactory,
  ConnectOptions,
  ListOptions,
  ListPage,
  RecordState,
  RecordView,
  ResponseView,
  Stats,
  StepView,
} from './backends/types';
export { CliError, EXIT, type ExitCode } from './errors';
export { type Io, main } from './main';
export { inScope, recordView, splitStoreKey, storeKeyOf } from './records';
