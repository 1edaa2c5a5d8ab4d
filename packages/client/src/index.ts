/**
 * A `fetch` that sends an `Idempotency-Key` and retries safely: the same key on every attempt, backoff with
 * jitter, `Retry-After` honoured. Depends on nothing but the platform's `fetch`.
 *
 * @module @oncely/client
 */
export {
  type GiveUpReason,
  IdempotentFetchBodyTooLargeError,
  IdempotentFetchError,
  IdempotentFetchOptionsError,
} from './errors';
export { type IdempotentFetch, type IdempotentRequestInit, idempotentFetch } from './fetch';
export type { Duration, DurationUnit, IdempotentFetchOptions, RetryEvent } from './options';
export type { AttemptOutcome } from './outcome';
