/**
 * Idempotent BullMQ processors for oncely: each job's work runs once per key across workers, and a duplicate
 * completes with the stored return value.
 *
 * @module @oncely/bullmq
 */
import { createHash } from 'node:crypto';
import {
  IdempotencyOptionsError,
  IdempotencySetupError,
  InvalidValueError,
  type Jsonified,
  type JsonStorable,
  PermanentError,
} from '@oncely/core';
import {
  type ConsumerOptions,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  canonicalJson,
  consumerRuntime,
} from '@oncely/core/adapter';
import {
  DelayedError,
  type Job,
  RateLimitError,
  UnrecoverableError,
  WaitingChildrenError,
  WaitingError,
} from 'bullmq';

/**
 * What the wrapper reads from a job: a BullMQ `Job` in a worker, or the `SandboxedJob` a sandboxed processor file
 * gets (both have these).
 */
export interface BullmqJob {
  /** The job's id: never its key (a job added twice has two ids). */
  readonly id?: string | undefined;
  /** The job's name: with `data`, what the fingerprint is computed from. */
  readonly name: string;
  /** The job's data: with `name`, what the fingerprint is computed from, so a key reused for other work is caught. */
  readonly data: unknown;
  /** Failed attempts so far: BullMQ's own count, which its `attempts`/`backoff` options act on. */
  readonly attemptsMade: number;
  /** Moves the job back to delayed until `timestamp` (ms since the epoch): how a job whose key is busy waits. */
  moveToDelayed(timestamp: number, token?: string): Promise<void>;
}

/** What the wrapper did with one job, for metrics and logs (`onSettled`). */
export type BullmqSettledEvent<J extends BullmqJob = Job<unknown, unknown>> = ConsumerSettledEvent<J>;

// BullMQ retries a failed job by the job's own `attempts` and `backoff`: two retry policies would fight.
const REFUSED_OPTIONS: Readonly<Record<string, string>> = {
  maxAttempts:
    "is not used by @oncely/bullmq: a failed job is retried by BullMQ, per the job's own options: queue.add(name, data, { attempts: 5, backoff: { type: 'exponential', delay: 1000 } }).",
  retryDelay:
    "is not used by @oncely/bullmq: the delay between attempts is the job's own backoff option: queue.add(name, data, { attempts: 5, backoff: { type: 'exponential', delay: 1000 } }).",
};

/**
 * The shared consumer options (docs/consumers.md) except `maxAttempts` and `retryDelay` (a failed job follows its
 * own `attempts`/`backoff`), and the required `key`. A job without a key fails without retries unless
 * `onMissingKey: 'process'`; `'dead-letter'` here means BullMQ's failed set.
 */
export interface BullmqProcessorOptions<J extends BullmqJob = Job<unknown, unknown>>
  extends Omit<ConsumerOptions<J>, 'maxAttempts' | 'retryDelay'> {
  /**
   * The key of a job: the same for every job that is the same piece of work, e.g.
   * `(job) => \`charge:${job.data.orderId}\``. Return `undefined` when the job has none. Required: the job id is
   * no key (a job added twice has two ids).
   */
  key: (job: J) => string | undefined;
}

/**
 * What `fn` may return: nothing (the job completes with `null`), or a value JSON can store and give back (see
 * `JsonStorable` in `@oncely/core`): a BigInt, a Map or a Set does not compile.
 */
export type BullmqStorable<R> = R extends void ? R : JsonStorable<R>;

/**
 * What a job completes with, on its first run and as a duplicate alike: `fn`'s result as JSON gives it back (a
 * `Date` becomes a string), `null` for nothing.
 */
export type BullmqResult<R> = R extends void ? null : Jsonified<R>;

/** A BullMQ processor: `(job, token, signal)`, as `new Worker(name, processor)` calls it. */
export type IdempotentProcessor<J extends BullmqJob, R> = (
  job: J,
  token?: string,
  signal?: AbortSignal,
) => Promise<R>;

/**
 * Wraps a BullMQ processor so that each key's work runs at most once across every worker sharing `store`, and
 * settles every job:
 *
 * - `fn` finished → the job completes with `fn`'s return value as JSON gives it back (`BullmqResult<R>`), which
 *   is stored; a later job with the same key completes with that stored value without running `fn`;
 * - the key is held by a job running elsewhere, or the store is unreachable → the job is moved back to delayed for
 *   `inProgressDelay` (`job.moveToDelayed` + `DelayedError`): not failed, no attempt counted;
 * - `fn` threw → the error is re-thrown: BullMQ retries per the job's `attempts`/`backoff`, then fails it (an
 *   idempotency error from an inner `idempotent()` call is such a failure too, never a replay or a delay);
 * - `fn` moved its own job (`DelayedError`, `WaitingChildrenError`, `WaitingError`, a rate limit) → re-thrown for
 *   BullMQ to finish the move; the key is released, nothing is reported;
 * - a permanent error (`PermanentError`, BullMQ's `UnrecoverableError`, `isPermanent`; also replayed to later
 *   duplicates), no key, a key reused for different data (fingerprint), or a bad key → `UnrecoverableError`: failed
 *   at once, no retries.
 *
 * A job completes only once its work finished (here or in an earlier job with its key). Works as the default
 * export of a sandboxed processor file too.
 *
 * ```ts
 * new Worker('orders', idempotentProcessor(charge, { store, key: (job) => job.data.orderId }), { connection });
 * ```
 */
export function idempotentProcessor<R, J extends BullmqJob = Job<unknown, unknown>>(
  fn: (
    job: J,
    token?: string,
    signal?: AbortSignal,
  ) => (R & BullmqStorable<R>) | Promise<R & BullmqStorable<R>>,
  options: BullmqProcessorOptions<J>,
): IdempotentProcessor<J, BullmqResult<R>> {
  if (typeof fn !== 'function') {
    throw new IdempotencyOptionsError(
      'fn',
      `must be the processor function (job, token) => result; got ${typeof fn}.`,
    );
  }
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object with at least a key function: { store, key: (job) => job.data.orderId }.',
    );
  }
  for (const [name, fix] of Object.entries(REFUSED_OPTIONS)) {
    if (name in options) throw new IdempotencyOptionsError(name, fix);
  }
  const key: unknown = options.key;
  if (typeof key !== 'function') {
    throw new IdempotencyOptionsError(
      'key',
      'is required: a function of the job that names its work, the same for every job that is the same work, e.g. key: (job) => job.data.orderId. Not job.id: a job added twice has two ids.',
    );
  }
  const keyOf = key as (job: J) => unknown;
  // Checked by the runtime as given (a non-function is refused there); only functions are wrapped.
  const userIsPermanent: unknown = options.isPermanent;
  const basePermanent =
    typeof userIsPermanent === 'function'
      ? (userIsPermanent as (error: unknown) => boolean)
      : (error: unknown) => error instanceof PermanentError;
  const runtime = consumerRuntime<J>(
    (job) => fn(job),
    {
      ...options,
      // BullMQ counts attempts (job.attemptsMade) and ends retries by the job's `attempts`: the runtime never does.
      maxAttempts: Number.MAX_SAFE_INTEGER,
      ...(userIsPermanent === undefined || typeof userIsPermanent === 'function'
        ? {
            // BullMQ's own control errors (fn moved its job) are never failures; its UnrecoverableError is always
            // permanent (BullMQ will not retry it), so it is stored and replayed to duplicates like a PermanentError.
            isPermanent: (error: unknown) =>
              !isControlError(error) && (isUnrecoverable(error) || basePermanent(error) === true),
          }
        : {}),
    },
    {
      name: '@oncely/bullmq',
      options: ['key'],
      keyOf: (job) => keyString(keyOf(job)),
      fingerprint: jobHash,
      storeResults: true,
    },
  );
  const { log } = runtime;

  const report = (job: J, key: string | undefined, settlement: ConsumerSettlement, failures: number) => {
    const event = runtime.settledEvent(job, key, settlement, failures);
    runtime.report(event);
  };

  return async (job, token, signal) => {
    const failuresBefore = attemptsOf(job);
    // What fn threw, if it did: a BullMQ control error is fn moving its own job, not a failure.
    let thrown: { error: unknown } | undefined;
    const decision = await runtime.decide(job, failuresBefore, async () => {
      let value: R;
      try {
        value = await fn(job, token, signal);
      } catch (error) {
        thrown = { error };
        throw error;
      }
      // BullMQ stores an undefined return value as null; so does this, rather than refusing it as unstorable.
      return value === undefined ? null : value;
    });
    const { key, result, settlement } = decision;
    // fn moved its own job (moveToDelayed, moveToWaitingChildren, a rate limit): BullMQ finishes that move.
    // Nothing is settled yet (the key was released, fn runs again), so nothing is reported. Anything else fn threw
    // the runtime settles as fn failing (retry, or dead-letter when permanent), whatever its class.
    if (thrown !== undefined && isControlError(thrown.error)) throw thrown.error;
    switch (settlement.action) {
      case 'ack':
        report(job, key, settlement, failuresBefore);
        // `unstorable`: the work ran, but its value could not be stored (no JSON form, or over maxResultBytes):
        // the job completes with null, as every duplicate will (docs/consumers.md).
        return (result ?? null) as BullmqResult<R>;
      case 'delay': {
        if (typeof token !== 'string') {
          throw new IdempotencySetupError(
            'oncely: the processor was called without the worker token (its second argument), so the job cannot be moved back to delayed; let a BullMQ Worker call it.',
          );
        }
        await job.moveToDelayed(Date.now() + settlement.delayMs, token);
        report(job, key, settlement, failuresBefore);
        throw new DelayedError();
      }
      case 'retry': {
        // BullMQ decides: another attempt after the job's backoff, or failed once `attempts` are used up.
        const attempts = attemptsAllowed(job);
        const last = settlement.failures >= attempts;
        const reported: ConsumerSettlement = last
          ? { action: 'dead-letter', reason: 'retries-exhausted', error: settlement.error }
          : settlement;
        const event = runtime.settledEvent(job, key, reported, settlement.failures);
        delete event.delayMs; // the job's backoff, not oncely, sets the delay
        runtime.report(event);
        throw asError(settlement.error);
      }
      case 'dead-letter': {
        log.warn(
          { key, reason: settlement.reason, err: settlement.error, jobId: job.id },
          'oncely: job failed without retries',
        );
        report(job, key, settlement, failuresBefore + 1);
        throw unrecoverable(settlement);
      }
    }
  };
}

/** The default fingerprint: SHA-256 of the job's name and data as canonical JSON (keys sorted). */
export function jobHash(job: BullmqJob): string {
  return createHash('sha256')
    .update(canonicalJson([job.name, job.data ?? null]))
    .digest('base64url');
}

function keyString(value: unknown): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'string') return value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  if (isThenable(value)) {
    throw new InvalidValueError('key(job) returned a promise: the key function must be synchronous');
  }
  throw new InvalidValueError(
    `key(job) must return a string (or undefined for "no key"); got ${typeof value}`,
  );
}

function attemptsOf(job: BullmqJob): number {
  const n = job.attemptsMade;
  return typeof n === 'number' && Number.isSafeInteger(n) && n > 0 ? n : 0;
}

function attemptsAllowed(job: BullmqJob): number {
  const attempts = (job as { opts?: { attempts?: unknown } }).opts?.attempts;
  return typeof attempts === 'number' && attempts >= 1 ? attempts : 1;
}

// The errors a processor throws after moving its own job (BullMQ's worker recognises them by name or message, as
// they cross a sandbox boundary as plain objects): not failures, the job is delayed, waiting or rate limited.
const CONTROL_ERRORS = new Set(['DelayedError', 'WaitingError', 'WaitingChildrenError', 'RateLimitError']);
const RATE_LIMIT_MESSAGE = 'bullmq:rateLimitExceeded';

function isControlError(error: unknown): boolean {
  if (
    error instanceof DelayedError ||
    error instanceof WaitingError ||
    error instanceof WaitingChildrenError ||
    error instanceof RateLimitError
  ) {
    return true;
  }
  if (error === null || typeof error !== 'object') return false;
  const { name, message } = error as { name?: unknown; message?: unknown };
  return (typeof name === 'string' && CONTROL_ERRORS.has(name)) || message === RATE_LIMIT_MESSAGE;
}

function isUnrecoverable(error: unknown): boolean {
  return (
    error instanceof UnrecoverableError ||
    (error !== null &&
      typeof error === 'object' &&
      (error as { name?: unknown }).name === 'UnrecoverableError')
  );
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    value !== null &&
    (typeof value === 'object' || typeof value === 'function') &&
    typeof (value as { then?: unknown }).then === 'function'
  );
}

function asError(error: unknown): Error {
  if (error instanceof Error) return error;
  // BullMQ records `error.message` as the failed reason: keep a thrown object's own message.
  const wrapped = new Error(messageOf(error));
  wrapped.cause = error;
  return wrapped;
}

function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message;
  if (error !== null && typeof error === 'object') {
    const { message } = error as { message?: unknown };
    if (typeof message === 'string') return message;
  }
  return String(error);
}

function unrecoverable(
  settlement: Extract<ConsumerSettlement, { action: 'dead-letter' }>,
): UnrecoverableError {
  const message =
    settlement.reason === 'missing-key'
      ? "oncely: the job has no idempotency key (key(job) returned undefined); failed without running. onMissingKey: 'process' runs such jobs unprotected."
      : settlement.error === undefined
        ? `oncely: ${settlement.reason}`
        : messageOf(settlement.error);
  const error = new UnrecoverableError(message);
  if (settlement.error !== undefined) error.cause = settlement.error;
  return error;
}
