import { runInContext } from '../shared/context';
import { IdempotencyOptionsError } from '../shared/errors';
import { checkKey, fingerprintOf, Lease, type LeaseSettings, verdictOf, Wait } from '../shared/protocol';
import { ExecutionContext } from '../shared/steps';
import type {
  AcquiredResult,
  AcquireResult,
  CompletedResult,
  InProgressResult,
  StoredResponse,
} from '../stores/store';
import { IdempotencyKeyError, IdempotencyStoreError, UnstorableResultError } from './errors';
import {
  type IdempotentOptions,
  type ResolvedIdempotentOptions,
  resolveIdempotentOptions,
} from './idempotent-options';
import type { Jsonified, JsonStorable } from './json';
import {
  encodeResult,
  failureRecord,
  notStoredRecord,
  type ResultSerializer,
  replayResult,
  resultRecord,
  textOf,
} from './result-codec';

/** What the outcome-aware form resolves to. */
export interface IdempotentOutcome<R> {
  /**
   * `'executed'`: this call ran the function. `'replayed'`: an earlier call did; `result` is its stored result.
   * With the default JSON serialiser, `result` is the JSON round trip of the function's value either way.
   */
  outcome: 'executed' | 'replayed';
  /** The function's result, or the stored one for a duplicate. */
  result: R;
  /** The store key the call used. */
  key: string;
}

/**
 * Options whose type declares `serialize` without saying whether it is set (a variable typed `IdempotentOptions`):
 * the result is then `fn`'s own type or its JSON form. Options written without `serialize` take the JSON overload,
 * so that a result JSON cannot carry stays a compile error there.
 */
type SerializeMaybeSet<O> = 'serialize' extends keyof O
  ? unknown
  : {
      readonly 'oncely: without a serialize option the result is stored as JSON; overload 2 says what stops it': true;
    };

/**
 * Wraps `fn` so that it runs at most once per key while the key's record lives (`ttl`), across every process that
 * shares the store. The first call with a key runs `fn` and stores its result; later calls with the key get the
 * stored result without running `fn`. While the first call runs, others get `IdempotencyInProgressError` (or wait,
 * with `inProgress: { wait }`). If `fn` throws, the key is released so a retry runs it again, unless the error is
 * permanent (`PermanentError`, or `isPermanent`), which is stored and re-thrown to duplicates.
 *
 * Results are stored as JSON by default, and every call, the first included, resolves to what `JSON.parse` gives
 * back (typed `Jsonified<R>`: a `Date` becomes a string). A result type JSON cannot carry (`undefined`, a BigInt, a
 * symbol, a Map or Set: see `JsonStorable`) does not compile; a value the types cannot see (a circular structure,
 * a function-valued own property, more than `maxResultBytes`) is found only after `fn` ran: the call throws
 * `UnstorableResultError` and the key is recorded as executed, so `fn` never runs twice. With a `serialize` option,
 * any result type is accepted, the first call gets `fn`'s own value and duplicates get `deserialize()`'s.
 * Options in a variable typed `IdempotentOptions` may or may not hold a `serialize`: the call then resolves to
 * `R | Jsonified<R>`.
 *
 * Options are checked here, once; mistakes throw `IdempotencyOptionsError`.
 */
export function idempotent<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R> & { serialize: ResultSerializer<R> },
): (...args: Args) => Promise<R>;
export function idempotent<Args extends unknown[], R>(
  fn: (...args: Args) => (R & JsonStorable<R>) | Promise<R & JsonStorable<R>>,
  options: IdempotentOptions<Args, R> & { serialize?: undefined },
): (...args: Args) => Promise<Jsonified<R>>;
export function idempotent<Args extends unknown[], R, O extends IdempotentOptions<Args, R>>(
  fn: (...args: Args) => R | Promise<R>,
  options: O & SerializeMaybeSet<O>,
): (...args: Args) => Promise<R | Jsonified<R>>;
export function idempotent<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R>,
): (...args: Args) => Promise<R | Jsonified<R>> {
  // The overload that passes R through unchecked: the caller's overload has checked it already.
  const run = idempotentOutcome<Args, R>(
    fn,
    options as IdempotentOptions<Args, R> & { serialize: ResultSerializer<R> },
  );
  return async (...args: Args) => (await run(...args)).result;
}

/**
 * The outcome-aware form of `idempotent()`, for wrappers that act differently on a first run and a replay: resolves
 * to `{ outcome: 'executed' | 'replayed', result, key }`; throws what `idempotent()` throws.
 */
export function idempotentOutcome<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R> & { serialize: ResultSerializer<R> },
): (...args: Args) => Promise<IdempotentOutcome<R>>;
export function idempotentOutcome<Args extends unknown[], R>(
  fn: (...args: Args) => (R & JsonStorable<R>) | Promise<R & JsonStorable<R>>,
  options: IdempotentOptions<Args, R> & { serialize?: undefined },
): (...args: Args) => Promise<IdempotentOutcome<Jsonified<R>>>;
export function idempotentOutcome<Args extends unknown[], R, O extends IdempotentOptions<Args, R>>(
  fn: (...args: Args) => R | Promise<R>,
  options: O & SerializeMaybeSet<O>,
): (...args: Args) => Promise<IdempotentOutcome<R | Jsonified<R>>>;
export function idempotentOutcome<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R>,
): (...args: Args) => Promise<IdempotentOutcome<R | Jsonified<R>>> {
  const o = resolveWrapped(fn, options);
  return (...args: Args) => runOnce(fn, o, args, undefined);
}

/**
 * @internal `idempotentOutcome` whose calls each take their own lease settings (the consumer runtime's, from
 * `decide()`), with the arguments as an array.
 */
export function leasedOutcome<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R>,
): (lease: LeaseSettings | undefined, args: Args) => Promise<IdempotentOutcome<R>> {
  const o = resolveWrapped(fn, options);
  return (lease, args) => runOnce(fn, o, args, lease);
}

function resolveWrapped<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  options: IdempotentOptions<Args, R>,
): ResolvedIdempotentOptions<Args, R> {
  if (typeof fn !== 'function') {
    throw new IdempotencyOptionsError('fn', `must be the function to wrap; got ${typeof fn}.`);
  }
  return resolveIdempotentOptions(options);
}

/** `idempotent.withOutcome(fn, options)`: the same as `idempotentOutcome(fn, options)`. */
idempotent.withOutcome = idempotentOutcome;

async function runOnce<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  o: ResolvedIdempotentOptions<Args, R>,
  args: Args,
  lease: LeaseSettings | undefined,
): Promise<IdempotentOutcome<R>> {
  // Key and fingerprint come from the arguments as they are now, before fn can change them.
  let key: string;
  let fingerprint = '';
  try {
    key = computeKey(o, args);
    if (o.fingerprint !== undefined) fingerprint = fingerprintOf(o.fingerprint, args);
  } catch (error) {
    o.hooks.decided('rejected', undefined, undefined, o.log);
    throw error;
  }
  // Made at the first in_progress answer in wait mode only.
  let wait: Wait | undefined;
  const acquire = async (): Promise<AcquireResult> => {
    try {
      return await o.protocol.acquire(key, fingerprint, lease?.endsAt);
    } catch (error) {
      o.protocol.acquireFailed(key, error, wait?.start, o.log);
      throw new IdempotencyStoreError(key, 'acquire', { cause: error });
    }
  };

  let result = await acquire();
  for (;;) {
    switch (verdictOf(result, fingerprint, o.fingerprint !== undefined)) {
      case 'acquired':
        o.hooks.decided('executed', key, wait?.start, o.log);
        return execute(fn, o, args, key, result as AcquiredResult, lease);
      case 'completed':
        o.hooks.decided('replayed', key, wait?.start, o.log);
        return {
          outcome: 'replayed',
          result: replayResult(o.serializer, key, (result as CompletedResult).response),
          key,
        };
      case 'in_progress':
        if (wait === undefined && o.waitMs !== undefined) wait = new Wait(o.waitMs);
        if (
          wait !== undefined &&
          (await wait.next(o.store, key, (result as InProgressResult).retryAfterMs))
        ) {
          result = await acquire();
          break;
        }
        throw o.protocol.refusal('in_progress', key, result, wait?.start, o.log);
      case 'mismatch':
        // A resumed record kept for another fingerprint was acquired all the same: give it back untouched.
        await o.protocol.giveBack(key, result, o.log);
        throw o.protocol.refusal('mismatch', key, result, wait?.start, o.log);
      default:
        throw o.protocol.refusal('unknown', key, result, wait?.start, o.log);
    }
  }
}

function computeKey<Args extends unknown[], R>(o: ResolvedIdempotentOptions<Args, R>, args: Args): string {
  let key: unknown;
  try {
    key = o.key(...args);
  } catch (error) {
    throw new IdempotencyKeyError('the key function threw; nothing ran.', { cause: error });
  }
  if (typeof key !== 'string' || key.length === 0) {
    throw new IdempotencyKeyError(
      `the key function must return a non-empty string; got ${key === '' ? 'an empty string' : typeof key}. Nothing ran.`,
    );
  }
  checkKey(key, o.maxKeyLength);
  return key;
}

async function execute<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  o: ResolvedIdempotentOptions<Args, R>,
  args: Args,
  key: string,
  acquired: AcquiredResult,
  settings: LeaseSettings | undefined,
): Promise<IdempotentOutcome<R>> {
  const { token } = acquired;
  const lease = new Lease(o.protocol, key, token, o.log, settings);
  o.hooks.executionStarted(key, o.log);
  // fn reads it through currentIdempotency(): step() and keyFor() under this call's key (before any store prefix).
  const context = new ExecutionContext(key, key, undefined, o.steps, o.log, token, acquired.steps);
  let value: R;
  try {
    value = await runInContext(context, () => fn(...args));
  } catch (error) {
    const permanent = isPermanentSafely(o, error);
    // Before the key is given back, let steps still running (Promise.all beside the step that threw) be recorded,
    // the lease renewed meanwhile; a permanent failure is completed instead, and completion drops steps.
    if (permanent) ExecutionContext.finish(context);
    else await ExecutionContext.finishAfterSteps(context);
    lease.stop();
    if (permanent) {
      await finish(o, key, token, failureRecord(error), 'a permanent failure');
    } else {
      try {
        o.protocol.released(key, await o.store.release(key, token), 'error', undefined, o.log);
      } catch (releaseError) {
        o.protocol.releaseFailed(key, releaseError, o.log);
      }
    }
    o.hooks.executionEnded(key, o.log);
    throw error;
  }
  ExecutionContext.finish(context);
  lease.stop();
  const encoded = encodeResult(o.serializer, o.maxResultBytes, value);
  if ('reason' in encoded) {
    // fn has run: record the key as executed (never release it, or a retry would run fn twice), then refuse.
    await finish(o, key, token, notStoredRecord(encoded.reason), 'an executed-but-not-stored marker');
    o.hooks.executionEnded(key, o.log);
    throw new UnstorableResultError(key, encoded.reason, false, { cause: encoded.cause });
  }
  await finish(o, key, token, resultRecord(o.serializer, encoded.bytes), 'the result');
  o.hooks.executionEnded(key, o.log);
  // With the default JSON, the caller that ran fn gets the JSON round trip of its value, as every duplicate does:
  // one type for both, and a result that only works before the round trip fails on the first call, not on a replay.
  // A custom serialiser's callers get fn's own value: its deserialize() is trusted to give back the same type.
  return {
    outcome: 'executed',
    result: o.serializer === undefined ? (JSON.parse(textOf(encoded.bytes)) as R) : value,
    key,
  };
}

/** Stores the final record. Never throws: fn has run, and the caller must learn its outcome either way. */
async function finish<Args extends unknown[], R>(
  o: ResolvedIdempotentOptions<Args, R>,
  key: string,
  token: string,
  record: StoredResponse,
  what: string,
): Promise<void> {
  try {
    o.protocol.completed(key, await o.store.complete(key, token, record, o.ttlMs), record.status, o.log);
  } catch (error) {
    o.protocol.completeFailed(key, error, what, o.log);
  }
}

function isPermanentSafely<Args extends unknown[], R>(
  o: ResolvedIdempotentOptions<Args, R>,
  error: unknown,
): boolean {
  try {
    return o.isPermanent(error) === true;
  } catch (predicateError) {
    // A broken predicate must not lose the original error; treating it as transient keeps the key retryable.
    o.log.error({ err: predicateError }, 'oncely: isPermanent threw; treating the error as transient');
    return false;
  }
}
