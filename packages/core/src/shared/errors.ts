/**
 * What marks an error as oncely's. A registered symbol, so that every copy of oncely in a process (an ESM and a CJS
 * copy, `@oncely/client`, which does not depend on this package) marks its errors the same way.
 */
const ONCELY_ERROR = Symbol.for('oncely.error');

/**
 * The base of every error oncely throws: `error instanceof OncelyError` tells oncely's errors from the app's. The
 * check reads a mark on the error rather than its class, so errors that keep an older base class for
 * compatibility (`IdempotencyOptionsError` is a `TypeError`) are `OncelyError`s too.
 */
export class OncelyError extends Error {
  /**
   * `value instanceof OncelyError` is `true` for every error oncely throws, whatever its class; `instanceof` a
   * subclass checks the class as usual.
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    // A subclass keeps the ordinary check: an IdempotencyKeyError is not an IdempotencyStoreError.
    // biome-ignore lint/complexity/noThisInStatic: `this` is the subclass the check is made against.
    if (this !== OncelyError) return Function.prototype[Symbol.hasInstance].call(this, value);
    return (
      (typeof value === 'object' || typeof value === 'function') &&
      value !== null &&
      (value as { [ONCELY_ERROR]?: unknown })[ONCELY_ERROR] === true
    );
  }
}

/** Marks the errors of a class as oncely's, for a class that cannot extend `OncelyError` (one of `TypeError`'s). */
export function markOncelyError(errorClass: abstract new (...args: never[]) => Error): void {
  Object.defineProperty(errorClass.prototype, ONCELY_ERROR, { value: true });
}
markOncelyError(OncelyError);

/**
 * Thrown at construction when an option is wrong; `option` names it, and the message says how to fix it. A
 * `TypeError` (as it always was) and an `OncelyError`.
 */
export class IdempotencyOptionsError extends TypeError {
  /** Always `'IdempotencyOptionsError'`. */
  override readonly name = 'IdempotencyOptionsError';
  /** Builds the error; the message reads `<from>: option "<option>" <message>`. */
  constructor(
    /** The option that is wrong, e.g. `'ttl'`. */
    readonly option: string,
    /** What is wrong with it and how to fix it. */
    message: string,
    /** Who checks the option, for the message: `'oncely/redis'` for a store's. */
    from = 'oncely',
  ) {
    super(`${from}: option "${option}" ${message}`);
  }
}
markOncelyError(IdempotencyOptionsError);

/**
 * A value handed to oncely, or returned by a function given to it (`scope()`, a key function, a handler), is of a
 * kind oncely cannot use: a duration that is not one, a scope that is not a string, a response chunk that is not
 * bytes. A `TypeError`, as these always were, and an `OncelyError`.
 */
export class InvalidValueError extends TypeError {
  /** Always `'InvalidValueError'`. */
  override name = 'InvalidValueError';
}
markOncelyError(InvalidValueError);

/**
 * A value is outside what oncely can take: a response status no HTTP response can have, `toJSON()` results that
 * chain without end. A `RangeError`, as these always were, and an `OncelyError`.
 */
export class ValueOutOfRangeError extends RangeError {
  /** Always `'ValueOutOfRangeError'`. */
  override name = 'ValueOutOfRangeError';
}
markOncelyError(ValueOutOfRangeError);

/**
 * A store operation failed in a way oncely found itself (an item that is not an oncely record, a reply it does not
 * know, no stable answer after its retries), not with an error of the store's client.
 */
export class StoreOperationError extends OncelyError {
  /** Always `'StoreOperationError'`. */
  override readonly name = 'StoreOperationError';
}

/**
 * Thrown by a store when a transaction's COMMIT got no answer (a client-side timeout, or the connection lost while
 * it was sent): the database may have committed it or not. A retry with the same key finds out: it replays the
 * committed response, or runs again if nothing was kept. `cause` is the client's error.
 */
export class CommitOutcomeUnknownError extends OncelyError {
  /** Always `'CommitOutcomeUnknownError'`. */
  override readonly name = 'CommitOutcomeUnknownError';
}

/**
 * oncely is set up or called in a way it cannot work with: an unsupported framework platform, a transaction asked
 * for outside one, a processor called without what it needs. The message says how to fix it.
 */
export class IdempotencySetupError extends OncelyError {
  /** Always `'IdempotencySetupError'`. */
  override readonly name = 'IdempotencySetupError';
}

/** Why `step()` refused: see `StepError`. */
export type StepErrorReason =
  | 'invalid-name'
  | 'duplicate-name'
  | 'unstorable'
  | 'lease-lost'
  | 'unsupported-store'
  | 'finished';

/**
 * `step(name, fn)` refused, or could not record, the step `step`. `reason` says why: `'invalid-name'` (not a
 * non-empty, well-formed string of at most 200 characters without U+0000; `fn` did not run), `'duplicate-name'`
 * (the name was used already in this attempt; `fn` did not run), `'unstorable'` (`fn` ran, but its result has no
 * JSON form or is too large; nothing was recorded), `'lease-lost'` (the execution no longer owns its key: another attempt may own it
 * now, so the handler must stop; nothing was recorded), `'unsupported-store'` (the store cannot record steps; `fn`
 * did not run), `'finished'` (the execution was settled already: its response sent, or its call returned).
 */
export class StepError extends OncelyError {
  /** Always `'StepError'`. */
  override readonly name = 'StepError';
  /** Builds the error; the message is prefixed with `oncely: `. */
  constructor(
    /** Why the step was refused or not recorded. */
    readonly reason: StepErrorReason,
    /** The step's name, as passed to `step()`. */
    readonly step: string,
    /** What happened, for people. */
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`oncely: ${message}`, options);
  }
}
