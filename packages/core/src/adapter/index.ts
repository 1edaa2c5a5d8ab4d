/**
 * `@oncely/core/adapter`: what adapter, store and consumer-wrapper authors need, beside what `@oncely/core` gives
 * every app. An app does not import from here.
 *
 * @module @oncely/core/adapter
 */
export {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerRetryOptions,
  type ConsumerRetryPolicy,
  type ConsumerSettlement,
  resolveConsumerRetryPolicy,
  settlementFor,
} from '../consumer/retry';
export {
  type ConsumerBroker,
  type ConsumerDecision,
  type ConsumerOptions,
  type ConsumerRuntime,
  type ConsumerSettledEvent,
  consumerRuntime,
  type TransactionObservation,
} from '../consumer/runtime';
export { runStoreTransaction, type StoreTransactionOptions } from '../consumer/transaction';
// The types of settleInWorker (pg-boss), which ConsumerRuntime names.
export type { BrokerRetries, HandedBack, WorkerDelivery, WorkerVerbs } from '../consumer/worker-settlement';
export type { HttpDecision, HttpRequestInput } from '../http/engine';
export { type CapturedResponse, Execution } from '../http/execution';
export { canonicalJson, defaultFingerprint } from '../http/fingerprint';
export { ALWAYS_EXCLUDED_HEADERS, OMITTED_BODY_HEADER, type OutgoingHeaderValue } from '../http/headers';
export { type KeyProblem, parseKey } from '../http/key';
export {
  conflictingOptions,
  type NestedRefusal,
  nestedEngine,
  type Registration,
  refuseNested,
  registrationOf,
} from '../http/nested';
export type { ResolvedOptions } from '../http/options';
export { type ProblemDetails, problemResponse } from '../http/problems';
export type { RequestWithHeaders } from '../http/scope';
export { durationOption } from '../shared/checks';
export { markOncelyError } from '../shared/errors';
export { silentLogger } from '../shared/logger';
export { OBSERVERS, type ObservableOptions, storeKind } from '../shared/observe';
export type { LeaseSettings } from '../shared/protocol';
export { commitFailure } from '../stores/commit-failure';
export { withinDeadline } from '../stores/deadline';
export { type PurgeOptions, type Reaper, type ReaperOptions, startReaper } from '../stores/reaper';
export {
  type OpenSqlTransaction,
  openSqlTransaction,
  type SqlResult,
  type SqlTransactions,
  transactionOfRequest,
} from '../stores/sql-transactions';
export type {
  AcquiredResult,
  AcquireOptions,
  AcquireResult,
  CompletedResult,
  IdempotencyRecord,
  IdempotencyStore,
  InProgressResult,
  RecordedSteps,
  RecordState,
  StoredResponse,
  StoreTransaction,
  TransactionAcquiredResult,
  TransactionalIdempotencyStore,
} from '../stores/store';
export { undoAcquire } from '../stores/undo-acquire';
