import { type AttemptOutcome, describeOutcome } from './outcome';

/** A wrong option given to `idempotentFetch(options)`; `option` names it. */
export class IdempotentFetchOptionsError extends TypeError {
  /** Always `'IdempotentFetchOptionsError'`. */
  override name = 'IdempotentFetchOptionsError';
  /** The option that is wrong, e.g. `'maxAttempts'`. */
  readonly option: string;

  /** Builds the error for `option`; `message` says what is wrong and how to fix it. */
  constructor(option: string, message: string) {
    super(message);
    this.option = option;
  }
}

/**
 * A request body stream larger than `maxBodyBytes`: it cannot be kept to send again on a retry, so nothing was sent.
 * A `RangeError`, as it always was.
 */
export class IdempotentFetchBodyTooLargeError extends RangeError {
  /** Always `'IdempotentFetchBodyTooLargeError'`. */
  override name = 'IdempotentFetchBodyTooLargeError';
}

/**
 * Why a call gave up:
 * - `'max-attempts'`: `maxAttempts` attempts were made;
 * - `'deadline'`: the next attempt could not have ended within `deadline`;
 * - `'not-retryable'`: the single attempt of a request that is not retried (no key, a method outside
 *   `idempotentMethods`) failed with a network error or a timeout.
 */
export type GiveUpReason = 'max-attempts' | 'deadline' | 'not-retryable';

/**
 * The rejection of an idempotent fetch that ran out of attempts or time: it carries every attempt's outcome. A
 * caller's abort rejects with the signal's reason instead, as fetch does; a response that is not retried (a 2xx, a
 * 422) is returned, not thrown.
 */
export class IdempotentFetchError extends Error {
  /** Always `'IdempotentFetchError'`. */
  override name = 'IdempotentFetchError';
  /** Why the call gave up. */
  readonly reason: GiveUpReason;
  /** The key sent on every attempt; `undefined` when the request had none. */
  readonly key: string | undefined;
  /** The request's method. */
  readonly method: string;
  /** The request's URL. */
  readonly url: string;
  /** Every attempt's outcome, in order. */
  readonly attempts: readonly AttemptOutcome[];
  /** The last attempt's response when it had one (a retryable status); its body is unread, yours to read. */
  readonly response: Response | undefined;

  /** Builds the error from what the call saw; the message lists every attempt's outcome. */
  constructor(details: {
    reason: GiveUpReason;
    key: string | undefined;
    method: string;
    url: string;
    attempts: readonly AttemptOutcome[];
    response: Response | undefined;
  }) {
    const last = details.attempts[details.attempts.length - 1];
    const why =
      details.reason === 'max-attempts'
        ? `gave up after ${details.attempts.length} attempt${details.attempts.length === 1 ? '' : 's'} (maxAttempts)`
        : details.reason === 'deadline'
          ? `gave up at the deadline after ${details.attempts.length} attempt${details.attempts.length === 1 ? '' : 's'}`
          : 'failed and is not retried (no idempotency key, and its method is not in idempotentMethods)';
    super(
      `oncely: ${details.method} ${details.url} ${why}; ${details.attempts.map(describeOutcome).join('; ')}`,
      last?.kind === 'network-error' ? { cause: last.error } : undefined,
    );
    this.reason = details.reason;
    this.key = details.key;
    this.method = details.method;
    this.url = details.url;
    this.attempts = details.attempts;
    this.response = details.response;
  }
}

// `instanceof OncelyError` (@oncely/core's base of every error oncely throws) reads this registered symbol, so that
// these errors are oncely's without this package depending on @oncely/core.
for (const errorClass of [
  IdempotentFetchOptionsError,
  IdempotentFetchBodyTooLargeError,
  IdempotentFetchError,
]) {
  Object.defineProperty(errorClass.prototype, Symbol.for('oncely.error'), { value: true });
}
