/**
 * What an app imports: the function wrapper, the engine, the in-memory store, the errors, and the types of the
 * options and hooks a user writes. What adapter, store and consumer-wrapper authors need is `@oncely/core/adapter`.
 *
 * @module @oncely/core
 */
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
export { Idempotency } from './http/engine';
export type { IdempotencyOptions } from './http/options';
export { PROBLEM_TYPES } from './http/problems';
export { type ScopeByHeaderOptions, scopeByHeader } from './http/scope';
export {
  currentIdempotency,
  type IdempotencyContext,
  type StepResult,
  type StepStorable,
} from './shared/context';
export { type Duration, type DurationUnit, parseDuration } from './shared/duration';
export {
  CommitOutcomeUnknownError,
  IdempotencyOptionsError,
  IdempotencySetupError,
  InvalidValueError,
  OncelyError,
  StepError,
  type StepErrorReason,
  StoreOperationError,
  ValueOutOfRangeError,
} from './shared/errors';
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
  StepEvent,
  StoreErrorEvent,
  StoreOperation,
  StoreOperationEvent,
  UnconfirmedWriteEvent,
  UnconfirmedWriteOutcome,
  UnscopedCredentialsEvent,
} from './shared/hooks';
export type { Logger } from './shared/logger';
export { composeHooks } from './shared/observe';
export { MemoryStore, type MemoryStoreOptions } from './stores/memory-store';
export type {
  AcquiredResult,
  AcquireResult,
  CompletedResult,
  IdempotencyStore,
  InProgressResult,
  StoredResponse,
} from './stores/store';
