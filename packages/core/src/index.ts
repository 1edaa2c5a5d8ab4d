export {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyReplayError,
  IdempotencyStoreError,
  PermanentError,
  UnstorableResultError,
} from './consumer/errors';
export {
  type IdempotentOptions,
  type IdempotentOutcome,
  idempotent,
  idempotentOutcome,
  type ResultSerializer,
} from './consumer/idempotent';
export type { Jsonified, JsonStorable, JsonValue } from './consumer/json';
export {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerBroker,
  type ConsumerDecision,
  type ConsumerOptions,
  type ConsumerRetryOptions,
  type ConsumerRetryPolicy,
  type ConsumerRuntime,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  consumerRuntime,
  resolveConsumerRetryPolicy,
  settlementFor,
  type TransactionObservation,
} from './consumer/runtime';
export { runStoreTransaction, type StoreTransactionOptions } from './consumer/transaction';
export {
  type CapturedResponse,
  Execution,
  type HttpDecision,
  type HttpRequestInput,
  Idempotency,
  type IdempotencyContext,
} from './http/engine';
export { canonicalJson, defaultFingerprint } from './http/fingerprint';
export { ALWAYS_EXCLUDED_HEADERS, OMITTED_BODY_HEADER, type OutgoingHeaderValue } from './http/headers';
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
