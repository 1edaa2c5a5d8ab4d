export {
  type GiveUpReason,
  IdempotentFetchBodyTooLargeError,
  IdempotentFetchError,
  IdempotentFetchOptionsError,
} from './errors';
export { type IdempotentFetch, type IdempotentRequestInit, idempotentFetch } from './fetch';
export type { Duration, DurationUnit, IdempotentFetchOptions, RetryEvent } from './options';
export type { AttemptOutcome } from './outcome';
