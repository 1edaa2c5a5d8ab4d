export {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyReplayError,
  IdempotencyStoreError,
  PermanentError,
  UnstorableResultError,
} from './consumer/errors';
export { type IdempotentOutcome, idempotent, idempotentOutcome } from './consumer/idempotent';
export type { IdempotentOptions } from './consumer/idempotent-options';
export type { Jsonified, JsonStorable, JsonValue } from './consumer/json';
export type { ResultSerializer } from './consumer/result-codec';
export {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerRetryOptions,
  type ConsumerRetryPolicy,
  type ConsumerSettlement,
  resolveConsumerRetryPolicy,
  settlementFor,
} from './consumer/retry';
export {
  type ConsumerBroker,
  type ConsumerDecision,
  type ConsumerOptions,
  type ConsumerRuntime,
  type ConsumerSettledEvent,
  consumerRuntime,
  type TransactionObservation,
} from './consumer/runtime';
export { runStoreTransaction, type StoreTransactionOptions } from './consumer/transaction';
// Adapter-author types of settleInWorker (pg-boss): public because ConsumerRuntime names them.
export type {
  BrokerRetries,
  HandedBack,
  WorkerDelivery,
  WorkerVerbs,
} from './consumer/worker-settlement';
export {
  type CapturedResponse,
  Execution,
  type HttpDecision,
  type HttpRequestInput,
  Idempotency,
  type IdempotencyContext,
} from './http/engine';
export { canonicalJson, defaultFingerprint } from './http/fingerprint';
export { ALWAYS_EXCLUDED_HEADERS, type OutgoingHeaderValue } from './http/headers';
export { type KeyProblem, parseKey } from './http/key';
export {
  conflictingOptions,
  type NestedRefusal,
  nestedEngine,
  type Registration,
  refuseNested,
  registrationOf,
} from './http/nested';
export type { IdempotencyOptions, ResolvedOptions } from './http/options';
export { PROBLEM_TYPES, type ProblemDetails, problemResponse } from './http/problems';
export { type RequestWithHeaders, type ScopeByHeaderOptions, scopeByHeader } from './http/scope';
export { durationOption } from './shared/checks';
export { type Duration, type DurationUnit, parseDuration } from './shared/duration';
export { IdempotencyOptionsError } from './shared/errors';
export type {
  AdapterKind,
  CompleteEvent,
  ConflictEvent,
  DecisionEvent,
  DecisionOutcome,
  ExecutionEvent,
  FencedEvent,
  IdempotencyEvent,
  IdempotencyHooks,
  ReleaseEvent,
  StoreErrorEvent,
  StoreOperation,
  StoreOperationEvent,
  UnconfirmedWriteEvent,
  UnconfirmedWriteOutcome,
  UnscopedCredentialsEvent,
} from './shared/hooks';
export { type Logger, silentLogger } from './shared/logger';
export { composeHooks, OBSERVERS, type ObservableOptions, storeKind } from './shared/observe';
export { MemoryStore, type MemoryStoreOptions } from './stores/memory-store';
export type {
  AcquiredResult,
  AcquireOptions,
  AcquireResult,
  CompletedResult,
  IdempotencyRecord,
  IdempotencyStore,
  InProgressResult,
  RecordState,
  StoredResponse,
  StoreTransaction,
  TransactionAcquiredResult,
  TransactionalIdempotencyStore,
} from './stores/store';
export { undoAcquire } from './stores/undo-acquire';
