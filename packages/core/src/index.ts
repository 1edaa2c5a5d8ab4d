export {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyReplayError,
  IdempotencyStoreError,
  PermanentError,
  UnstorableResultError,
} from './consumer-errors';
export { type Duration, parseDuration } from './duration';
export {
  type CapturedResponse,
  Execution,
  type HttpDecision,
  type HttpRequestInput,
  Idempotency,
  type IdempotencyContext,
} from './engine';
export { IdempotencyOptionsError } from './errors';
export { canonicalJson, defaultFingerprint } from './fingerprint';
export { ALWAYS_EXCLUDED_HEADERS, type OutgoingHeaderValue } from './headers';
export {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerRetryOptions,
  type ConsumerRetryPolicy,
  type ConsumerSettlement,
  durationOption,
  type IdempotentOptions,
  type IdempotentOutcome,
  idempotent,
  idempotentOutcome,
  type ResultSerializer,
  resolveConsumerRetryPolicy,
  settlementFor,
} from './idempotent';
export { type KeyProblem, parseKey } from './key';
export { type Logger, silentLogger } from './logger';
export { MemoryStore, type MemoryStoreOptions } from './memory-store';
export type {
  CompleteEvent,
  ConflictEvent,
  FencedEvent,
  IdempotencyEvent,
  IdempotencyHooks,
  IdempotencyOptions,
  ReleaseEvent,
  ResolvedOptions,
  StoreErrorEvent,
  UnscopedCredentialsEvent,
} from './options';
export { PROBLEM_TYPES, type ProblemDetails, problemResponse } from './problems';
export { type RequestWithHeaders, type ScopeByHeaderOptions, scopeByHeader } from './scope';
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
} from './store';
