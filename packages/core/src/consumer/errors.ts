import { OncelyError } from '../shared/errors';

/**
 * Errors thrown by `idempotent()` (and seen by the broker wrappers built on it). Each carries the store key, so a
 * caller can log or route it without parsing the message.
 */

/** The key is held by a call that is still running (its lease is live). Nothing ran. */
export class IdempotencyInProgressError extends OncelyError {
  override readonly name = 'IdempotencyInProgressError';
  constructor(
    readonly key: string,
    /**
     * Time left on the running call's lease, in ms. The owner renews its lease while it runs, so this is not when
     * it will finish; it is how long a crashed owner can block the key at most.
     */
    readonly retryAfterMs: number,
  ) {
    super(`oncely: a call with key ${JSON.stringify(key)} is still in progress; retry later.`);
  }
}

/** The key was used before with a different fingerprint (a different message under the same key). Nothing ran. */
export class IdempotencyMismatchError extends OncelyError {
  override readonly name = 'IdempotencyMismatchError';
  constructor(readonly key: string) {
    super(
      `oncely: key ${JSON.stringify(key)} was already used with a different fingerprint; a new message needs a new key.`,
    );
  }
}

/** The key (or fingerprint) function threw, or returned something that is not a usable key. Nothing ran. */
export class IdempotencyKeyError extends OncelyError {
  override readonly name = 'IdempotencyKeyError';
  constructor(message: string, options?: { cause?: unknown }) {
    super(`oncely: ${message}`, options);
  }
}

/** The store failed (or timed out) while reserving the key. Nothing ran; retrying later is safe. */
export class IdempotencyStoreError extends OncelyError {
  override readonly name = 'IdempotencyStoreError';
  constructor(
    readonly key: string,
    readonly operation: 'acquire',
    options: { cause: unknown },
  ) {
    super(
      `oncely: the store failed during ${operation} for key ${JSON.stringify(key)}; nothing ran, retry later.`,
      options,
    );
  }
}

/**
 * The function ran, but its result could not be stored (not serialisable, or larger than `maxResultBytes`). The
 * key is recorded as executed anyway, so the function never runs again for it: its side effects happened once.
 * The first call and every duplicate get this error; `replayed` tells them apart. Result types JSON cannot carry
 * are compile errors (`JsonStorable`): this is for what the types do not show (a cycle, a value typed `unknown`).
 */
export class UnstorableResultError extends OncelyError {
  override readonly name = 'UnstorableResultError';
  /** Always `true`: the function ran before its result was found unstorable. */
  readonly executed = true;
  constructor(
    readonly key: string,
    /** Why the result could not be stored, e.g. `'the result is undefined'`. */
    readonly reason: string,
    /** `false` for the call that ran the function, `true` for a duplicate. */
    readonly replayed: boolean,
    options?: { cause?: unknown },
  ) {
    super(
      replayed
        ? `oncely: the call with key ${JSON.stringify(key)} ran, but its result could not be stored (${reason}); it will not run again.`
        : `oncely: the function ran (its side effects happened) but its result cannot be stored: ${reason}. The key is recorded as executed, so it will not run again. Return a JSON-serialisable value (null rather than undefined) or pass a serialize option.`,
      options,
    );
  }
}

/**
 * Marks a failure that a retry cannot fix (a declined card, a malformed message). Throw it from the wrapped
 * function, or pass `isPermanent` to classify your own errors. A permanent failure is stored like a result: the
 * key is not released, and duplicates get a `PermanentError` again (`replayed: true`) carrying the stored
 * `message`, `code` and `originalName`.
 */
export class PermanentError extends OncelyError {
  override readonly name: string = 'PermanentError';
  /** A machine-readable code, kept with the stored failure. */
  readonly code: string | number | undefined;
  /** The `name` of the error that failed the first call (`'PermanentError'` when it was one). */
  readonly originalName: string;
  /** `true` when this error was rebuilt from a stored failure for a duplicate. */
  readonly replayed: boolean;

  constructor(
    message: string,
    options: { cause?: unknown; code?: string | number; originalName?: string; replayed?: boolean } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = options.code;
    this.originalName = options.originalName ?? 'PermanentError';
    this.replayed = options.replayed ?? false;
  }
}

/** A record under the key could not be read back as a result (written by something else, or not deserialisable). */
export class IdempotencyReplayError extends OncelyError {
  override readonly name = 'IdempotencyReplayError';
  constructor(
    readonly key: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`oncely: cannot replay the record under key ${JSON.stringify(key)}: ${message}`, options);
  }
}
