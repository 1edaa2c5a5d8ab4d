import { OncelyError } from '../shared/errors';

/**
 * Errors thrown by `idempotent()` (and seen by the broker wrappers built on it). Each carries the store key, so a
 * caller can log or route it without parsing the message.
 */

/** The key is held by a call that is still running (its lease is live). Nothing ran. */
export class IdempotencyInProgressError extends OncelyError {
  /** Always `'IdempotencyInProgressError'`. */
  override readonly name = 'IdempotencyInProgressError';
  /** Builds the error for the held key. */
  constructor(
    /** The store key that is held. */
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
  /** Always `'IdempotencyMismatchError'`. */
  override readonly name = 'IdempotencyMismatchError';
  /** Builds the error for the key. */
  constructor(
    /** The store key that was used with another fingerprint. */
    readonly key: string,
  ) {
    super(
      `oncely: key ${JSON.stringify(key)} was already used with a different fingerprint; a new message needs a new key.`,
    );
  }
}

/** The key (or fingerprint) function threw, or returned something that is not a usable key. Nothing ran. */
export class IdempotencyKeyError extends OncelyError {
  /** Always `'IdempotencyKeyError'`. */
  override readonly name = 'IdempotencyKeyError';
  /** Builds the error; `message` is prefixed with `oncely: `, and `cause` is what the key function threw. */
  constructor(message: string, options?: { cause?: unknown }) {
    super(`oncely: ${message}`, options);
  }
}

/**
 * The store failed (or timed out). `operation` says where: `'acquire'`, while reserving the key (nothing ran;
 * retrying later is safe), or `'recordStep'`, while recording the step `step` (its function ran but was not
 * recorded, so a retry runs it again: pass `keyFor()` to what it calls so a downstream service deduplicates it).
 */
export class IdempotencyStoreError extends OncelyError {
  /** Always `'IdempotencyStoreError'`. */
  override readonly name = 'IdempotencyStoreError';
  /** With `operation: 'recordStep'`: the step's name. */
  readonly step: string | undefined;
  /** Builds the error; `cause` is the store's error, `step` the step's name with `operation: 'recordStep'`. */
  constructor(
    /** The store key of the call. */
    readonly key: string,
    /** Where the store failed: `'acquire'` (nothing ran) or `'recordStep'` (the step ran, unrecorded). */
    readonly operation: 'acquire' | 'recordStep',
    options: { cause: unknown; step?: string },
  ) {
    super(
      operation === 'acquire'
        ? `oncely: the store failed during acquire for key ${JSON.stringify(key)}; nothing ran, retry later.`
        : `oncely: the store failed to record step ${JSON.stringify(options.step)} for key ${JSON.stringify(key)}; the step ran but a retry runs it again (pass keyFor() to the services it calls so they deduplicate it).`,
      { cause: options.cause },
    );
    this.step = options.step;
  }
}

/**
 * The function ran, but its result could not be stored (not serialisable, or larger than `maxResultBytes`). The
 * key is recorded as executed anyway, so the function never runs again for it: its side effects happened once.
 * The first call and every duplicate get this error; `replayed` tells them apart. Result types JSON cannot carry
 * are compile errors (`JsonStorable`): this is for what the types do not show (a cycle, a value typed `unknown`).
 */
export class UnstorableResultError extends OncelyError {
  /** Always `'UnstorableResultError'`. */
  override readonly name = 'UnstorableResultError';
  /** Always `true`: the function ran before its result was found unstorable. */
  readonly executed = true;
  /** Builds the error; `cause` is what failed to serialise the result, when something threw. */
  constructor(
    /** The store key of the call. */
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
  /** `'PermanentError'`, or the name of a subclass that sets its own. */
  override readonly name: string = 'PermanentError';
  /** A machine-readable code, kept with the stored failure. */
  readonly code: string | number | undefined;
  /** The `name` of the error that failed the first call (`'PermanentError'` when it was one). */
  readonly originalName: string;
  /** `true` when this error was rebuilt from a stored failure for a duplicate. */
  readonly replayed: boolean;

  /**
   * Builds the error: `code` is kept with the stored failure, `cause` is the error it wraps. `originalName` and
   * `replayed` are set by oncely when it rebuilds a stored failure for a duplicate; an app leaves them out.
   */
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
  /** Always `'IdempotencyReplayError'`. */
  override readonly name = 'IdempotencyReplayError';
  /** Builds the error; `message` says why the record could not be read, `cause` is what failed to read it. */
  constructor(
    /** The store key whose record could not be replayed. */
    readonly key: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`oncely: cannot replay the record under key ${JSON.stringify(key)}: ${message}`, options);
  }
}
