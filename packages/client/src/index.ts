export { type GiveUpReason, IdempotentFetchError, IdempotentFetchOptionsError } from './errors';
export { type IdempotentFetch, type IdempotentRequestInit, idempotentFetch } from './fetch';
export type { IdempotentFetchOptions, RetryEvent } from './options';
export type { AttemptOutcome } from './outcome';
