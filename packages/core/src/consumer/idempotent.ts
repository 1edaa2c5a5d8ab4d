import {
  checkLogger,
  checkStore,
  durationOption,
  functionOption,
  inProgressOption,
  integerOption,
} from '../shared/checks';
import type { Duration } from '../shared/duration';
import { IdempotencyOptionsError } from '../shared/errors';
import { HookRunner, type IdempotencyHooks } from '../shared/hooks';
import { type Logger, silentLogger } from '../shared/logger';
import { hooksOf, type ObservableOptions, observedStore } from '../shared/observe';
import {
  checkKey,
  fingerprintOf,
  KeyProtocol,
  Lease,
  unknownStatusError,
  verdictOf,
  Wait,
} from '../shared/protocol';
import type { WarningCode } from '../shared/warnings';
import { MemoryStore } from '../stores/memory-store';
import type {
  AcquiredResult,
  AcquireResult,
  CompletedResult,
  IdempotencyStore,
  InProgressResult,
  StoredResponse,
} from '../stores/store';
import {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyReplayError,
  IdempotencyStoreError,
  PermanentError,
  UnstorableResultError,
} from './errors';
import type { Jsonified, JsonStorable } from './json';

/** Turns results into bytes for the store and back. The default is JSON (see `idempotent`). */
export interface ResultSerializer<R> {
  /** Stored as the record's `content-type`. Default: `'application/octet-stream'`. */
  contentType?: string;
  serialize(result: R): Uint8Array;
  deserialize(bytes: Uint8Array): R;
}

/**
 * Options of `idempotent()`. `Args` are the wrapped function's parameters; `key` and `fingerprint` receive them.
 * The object you pass is never modified.
 */
export interface IdempotentOptions<Args extends unknown[], R> extends ObservableOptions {
  /** Where records live. Default: a new `MemoryStore()` (this process only; use a shared store for several). */
  store?: IdempotencyStore;
  /**
   * The key of a call, computed once from the arguments before the function runs. Use a business id or the
   * producer's message id, never something that changes on redelivery (a delivery tag, a stream sequence).
   */
  key: (...args: Args) => string;
  /** What must match when a key is reused; a different value raises `IdempotencyMismatchError`. Default: no check. */
  fingerprint?: ((...args: Args) => string) | false;
  /** How long a finished result (or permanent failure) is kept and replayed. Default: `'24h'`. */
  ttl?: Duration;
  /** Lease of a running call; renewed every third of it while the function runs. Default: `'30s'`. */
  lockTimeout?: Duration;
  /** While the key is held: `'reject'` throws `IdempotencyInProgressError`; `{ wait }` waits that long to replay. */
  inProgress?: 'reject' | { wait: Duration };
  /**
   * How results are stored. Default: JSON, refusing what JSON would not give back (see docs/consumers.md); every
   * call then resolves to the JSON form of the result (`Jsonified<R>`). With a serialiser, to `R`.
   */
  serialize?: ResultSerializer<R>;
  /** Which errors are final: stored and re-thrown to duplicates instead of releasing the key. Default: `PermanentError`. */
  isPermanent?: (error: unknown) => boolean;
  /** Largest serialised result stored, in bytes. Default: 1 MiB. */
  maxResultBytes?: number;
  /** Longest key accepted. Default: `255`. */
  maxKeyLength?: number;
  /** A pino-compatible logger for lease and store trouble. Default: none. */
  logger?: Logger;
  /**
   * Observation hooks, the engine's (`onDecision`, `onStoreOperation`, `onExecutionStart`/`End`, `onComplete`,
   * `onRelease`, `onFenced`, `onStoreError`, `onUnconfirmedWrite`), with `adapter: 'consumer'`. Default: none.
   */
  hooks?: IdempotencyHooks;
}

/** What the outcome-aware form resolves to. */
export interface IdempotentOutcome<R> {
  /**
   * `'executed'`: this call ran the function. `'replayed'`: an earlier call did; `result` is its stored result.
   * With the default JSON serialiser, `result` is the JSON round trip of the function's value either way.
   */
  outcome: 'executed' | 'replayed';
  result: R;
  /** The store key the call used. */
  key: string;
}

interface Resolved<Args extends unknown[], R> {
  store: IdempotencyStore;
  key: (...args: Args) => string;
  fingerprint: ((...args: Args) => string) | undefined;
  ttlMs: number;
  lockTimeoutMs: number;
  waitMs: number | undefined;
  serializer: ResultSerializer<R> | undefined;
  isPermanent: (error: unknown) => boolean;
  maxResultBytes: number;
  maxKeyLength: number;
  log: Logger;
  /** This wrapper's hooks, run guarded; its process warnings (without a logger) are said once each. */
  hooks: HookRunner;
  /** What its calls do with each answer of the store (completion, release, renewal). */
  protocol: KeyProtocol;
}

// How a record written by idempotent() says what it holds: a result, a permanent failure, or "ran, not storable".
// HTTP-like statuses, so every store keeps them unchanged and an operator reading a record can tell them apart.
const STATUS_RESULT = 200;
const STATUS_NOT_STORED = 410;
const STATUS_FAILURE = 500;
const JSON_TYPE = 'application/json';

const KNOWN_OPTIONS = new Set([
  'store',
  'key',
  'fingerprint',
  'ttl',
  'lockTimeout',
  'inProgress',
  'serialize',
  'isPermanent',
  'maxResultBytes',
  'maxKeyLength',
  'logger',
  'hooks',
]);

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

/** The default `isPermanent`: a `PermanentError`. */
export const defaultIsPermanent = (error: unknown): boolean => error instanceof PermanentError;

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
  if (typeof fn !== 'function') {
    throw new IdempotencyOptionsError('fn', `must be the function to wrap; got ${typeof fn}.`);
  }
  const o = resolveIdempotentOptions(options);
  return (...args: Args) => runOnce(fn, o, args);
}

/** `idempotent.withOutcome(fn, options)`: the same as `idempotentOutcome(fn, options)`. */
idempotent.withOutcome = idempotentOutcome;

async function runOnce<Args extends unknown[], R>(
  fn: (...args: Args) => R | Promise<R>,
  o: Resolved<Args, R>,
  args: Args,
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
      return await o.protocol.acquire(key, fingerprint);
    } catch (error) {
      o.hooks.run('onStoreError', { key, operation: 'acquire', error }, o.log);
      o.hooks.decided('store_error', key, wait?.start, o.log);
      throw new IdempotencyStoreError(key, 'acquire', { cause: error });
    }
  };

  let result = await acquire();
  for (;;) {
    switch (verdictOf(result, fingerprint, o.fingerprint !== undefined)) {
      case 'acquired':
        o.hooks.decided('executed', key, wait?.start, o.log);
        return execute(fn, o, args, key, (result as AcquiredResult).token);
      case 'completed':
        o.hooks.decided('replayed', key, wait?.start, o.log);
        return { outcome: 'replayed', result: replay(o, key, (result as CompletedResult).response), key };
      case 'mismatch':
        o.hooks.decided('mismatch', key, wait?.start, o.log);
        throw new IdempotencyMismatchError(key);
      case 'in_progress': {
        const { retryAfterMs } = result as InProgressResult;
        if (wait === undefined && o.waitMs !== undefined) wait = new Wait(o.waitMs);
        if (wait === undefined || !(await wait.next(o.store, key, retryAfterMs))) {
          o.hooks.decided('conflict', key, wait?.start, o.log);
          throw new IdempotencyInProgressError(key, retryAfterMs);
        }
        result = await acquire();
        break;
      }
      default:
        // A store bug, not a decision: refuse rather than guess.
        o.hooks.decided('store_error', key, wait?.start, o.log);
        throw new IdempotencyStoreError(key, 'acquire', { cause: unknownStatusError(result) });
    }
  }
}

function computeKey<Args extends unknown[], R>(o: Resolved<Args, R>, args: Args): string {
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
  o: Resolved<Args, R>,
  args: Args,
  key: string,
  token: string,
): Promise<IdempotentOutcome<R>> {
  const lease = new Lease(o.protocol, key, token, o.log);
  if (o.hooks.hooks.onExecutionStart !== undefined)
    o.hooks.run('onExecutionStart', { adapter: 'consumer', key }, o.log);
  let value: R;
  try {
    value = await fn(...args);
  } catch (error) {
    lease.stop();
    if (isPermanentSafely(o, error)) {
      await finish(o, key, token, failureRecord(error), 'a permanent failure');
    } else {
      try {
        o.protocol.released(key, await o.store.release(key, token), 'error', undefined, o.log);
      } catch (releaseError) {
        o.protocol.releaseFailed(key, releaseError, o.log);
      }
    }
    executionEnded(o, key);
    throw error;
  }
  lease.stop();
  const encoded = encode(o, value);
  if ('reason' in encoded) {
    // fn has run: record the key as executed (never release it, or a retry would run fn twice), then refuse.
    await finish(o, key, token, notStoredRecord(encoded.reason), 'an executed-but-not-stored marker');
    executionEnded(o, key);
    throw new UnstorableResultError(key, encoded.reason, false, { cause: encoded.cause });
  }
  await finish(
    o,
    key,
    token,
    {
      status: STATUS_RESULT,
      headers: {
        'content-type':
          o.serializer === undefined ? JSON_TYPE : (o.serializer.contentType ?? 'application/octet-stream'),
      },
      body: encoded.bytes,
    },
    'the result',
  );
  executionEnded(o, key);
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
  o: Resolved<Args, R>,
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

function executionEnded<Args extends unknown[], R>(o: Resolved<Args, R>, key: string): void {
  if (o.hooks.hooks.onExecutionEnd !== undefined)
    o.hooks.run('onExecutionEnd', { adapter: 'consumer', key }, o.log);
}

function isPermanentSafely<Args extends unknown[], R>(o: Resolved<Args, R>, error: unknown): boolean {
  try {
    return o.isPermanent(error) === true;
  } catch (predicateError) {
    // A broken predicate must not lose the original error; treating it as transient keeps the key retryable.
    o.log.error({ err: predicateError }, 'oncely: isPermanent threw; treating the error as transient');
    return false;
  }
}

function replay<Args extends unknown[], R>(o: Resolved<Args, R>, key: string, response: StoredResponse): R {
  switch (response.status) {
    case STATUS_RESULT:
      try {
        return o.serializer === undefined
          ? (JSON.parse(textOf(response.body)) as R)
          : o.serializer.deserialize(response.body);
      } catch (error) {
        throw new IdempotencyReplayError(key, 'the stored result could not be deserialised.', {
          cause: error,
        });
      }
    case STATUS_FAILURE: {
      const failure = parseRecord(key, response.body);
      throw new PermanentError(typeof failure.message === 'string' ? failure.message : 'permanent failure', {
        code: typeof failure.code === 'string' || typeof failure.code === 'number' ? failure.code : undefined,
        originalName: typeof failure.name === 'string' ? failure.name : 'Error',
        replayed: true,
      });
    }
    case STATUS_NOT_STORED: {
      const marker = parseRecord(key, response.body);
      throw new UnstorableResultError(
        key,
        typeof marker.reason === 'string' ? marker.reason : 'unknown reason',
        true,
      );
    }
    default:
      throw new IdempotencyReplayError(
        key,
        `the record was not written by idempotent() (status ${response.status}); use distinct keys (or stores) for HTTP requests and function calls.`,
      );
  }
}

function parseRecord(key: string, body: Uint8Array): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(textOf(body));
    if (value !== null && typeof value === 'object') return value as Record<string, unknown>;
  } catch {
    // reported below
  }
  throw new IdempotencyReplayError(key, 'the stored record is malformed.');
}

function failureRecord(error: unknown): StoredResponse {
  const e = (error !== null && typeof error === 'object' ? error : {}) as {
    name?: unknown;
    message?: unknown;
    code?: unknown;
  };
  const failure: Record<string, unknown> = {
    name:
      error instanceof PermanentError ? error.originalName : typeof e.name === 'string' ? e.name : 'Error',
    message: typeof e.message === 'string' ? e.message : String(error),
  };
  if (typeof e.code === 'string' || typeof e.code === 'number') failure.code = e.code;
  return jsonRecord(STATUS_FAILURE, failure);
}

function notStoredRecord(reason: string): StoredResponse {
  return jsonRecord(STATUS_NOT_STORED, { reason });
}

function jsonRecord(status: number, value: unknown): StoredResponse {
  return {
    status,
    headers: { 'content-type': JSON_TYPE },
    body: new TextEncoder().encode(JSON.stringify(value)),
  };
}

const decoder = new TextDecoder();
function textOf(body: Uint8Array): string {
  return decoder.decode(body);
}

/** Bytes to store, or why the value cannot be stored (with the serialiser's error when there was one). */
function encode<Args extends unknown[], R>(
  o: Resolved<Args, R>,
  value: R,
): { bytes: Uint8Array } | { reason: string; cause?: unknown } {
  let bytes: Uint8Array;
  if (o.serializer !== undefined) {
    let out: unknown;
    try {
      out = o.serializer.serialize(value);
    } catch (error) {
      return { reason: `serialize() threw: ${messageOf(error)}`, cause: error };
    }
    if (!(out instanceof Uint8Array))
      return { reason: `serialize() returned ${typeof out}, not a Uint8Array` };
    bytes = out;
  } else {
    if (value === undefined) return { reason: 'the result is undefined (return null for "no result")' };
    let json: string | undefined;
    try {
      json = JSON.stringify(value, strictJson);
    } catch (error) {
      if (error instanceof NotJson) return { reason: error.message };
      const message = messageOf(error);
      return /circular/i.test(message)
        ? { reason: 'the result contains a circular reference', cause: error }
        : { reason: `JSON.stringify failed: ${message}`, cause: error };
    }
    if (json === undefined) return { reason: 'the result has no JSON form' };
    bytes = new TextEncoder().encode(json);
  }
  if (bytes.byteLength > o.maxResultBytes) {
    return {
      reason: `the result is ${bytes.byteLength} bytes, more than maxResultBytes (${o.maxResultBytes})`,
    };
  }
  return { bytes };
}

class NotJson extends Error {}

// JSON.stringify drops functions and symbols silently, writes Maps and Sets as {}, and throws on BigInt without
// saying where: refuse them all, naming the property, so a replay is never quietly different from the original.
function strictJson(this: unknown, key: string, value: unknown): unknown {
  const where = key === '' ? '' : ` at property ${JSON.stringify(key)}`;
  switch (typeof value) {
    case 'function':
      throw new NotJson(`the result contains a function${where}`);
    case 'symbol':
      throw new NotJson(`the result contains a symbol${where}`);
    case 'bigint':
      throw new NotJson(`the result contains a BigInt${where} (convert it to a string)`);
  }
  if (value instanceof Map || value instanceof Set) {
    throw new NotJson(`the result contains a ${value instanceof Map ? 'Map' : 'Set'}${where}`);
  }
  return value;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function resolveIdempotentOptions<Args extends unknown[], R>(
  options: IdempotentOptions<Args, R>,
): Resolved<Args, R> {
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object with at least a key function: { key: (msg) => msg.id }.',
    );
  }
  for (const name of Object.keys(options)) {
    if (!KNOWN_OPTIONS.has(name)) {
      throw new IdempotencyOptionsError(
        name,
        `is not an option of idempotent(); known options: ${[...KNOWN_OPTIONS].join(', ')}.`,
      );
    }
  }
  const o = options;
  if (typeof o.key !== 'function') {
    throw new IdempotencyOptionsError(
      'key',
      'is required: a function of the arguments that returns the key, e.g. { key: (msg) => msg.orderId }.',
    );
  }
  if (o.fingerprint !== undefined && o.fingerprint !== false && typeof o.fingerprint !== 'function') {
    throw new IdempotencyOptionsError(
      'fingerprint',
      `must be a function of the arguments that returns a string, or false; got ${typeof o.fingerprint}.`,
    );
  }
  const log = o.logger === undefined ? silentLogger : checkLogger(o.logger);
  const hooks = new HookRunner(hooksOf(o) ?? {}, 'consumer', new Set<WarningCode>());
  const store = o.store === undefined ? new MemoryStore() : checkStore(o.store);
  const resolved: Omit<Resolved<Args, R>, 'protocol'> = {
    store: observedStore(store, 'consumer', hooks.hooks, (event) =>
      hooks.run('onStoreOperation', event, log),
    ),
    key: o.key,
    fingerprint: typeof o.fingerprint === 'function' ? o.fingerprint : undefined,
    ttlMs: o.ttl === undefined ? 86_400_000 : durationOption('ttl', o.ttl),
    lockTimeoutMs: o.lockTimeout === undefined ? 30_000 : durationOption('lockTimeout', o.lockTimeout),
    waitMs: inProgressOption(o.inProgress),
    serializer: o.serialize === undefined ? undefined : checkSerializer(o.serialize),
    isPermanent:
      o.isPermanent === undefined ? defaultIsPermanent : functionOption('isPermanent', o.isPermanent),
    maxResultBytes:
      o.maxResultBytes === undefined ? 1_048_576 : integerOption('maxResultBytes', o.maxResultBytes),
    maxKeyLength: o.maxKeyLength === undefined ? 255 : integerOption('maxKeyLength', o.maxKeyLength),
    log,
    hooks,
  };
  return { ...resolved, protocol: new KeyProtocol(resolved.store, hooks, resolved.lockTimeoutMs) };
}

function checkSerializer<R>(value: ResultSerializer<R>): ResultSerializer<R> {
  if (
    value === null ||
    typeof value !== 'object' ||
    typeof value.serialize !== 'function' ||
    typeof value.deserialize !== 'function'
  ) {
    throw new IdempotencyOptionsError(
      'serialize',
      'must be an object { serialize(result): Uint8Array, deserialize(bytes): result }.',
    );
  }
  if (value.contentType !== undefined && typeof value.contentType !== 'string') {
    throw new IdempotencyOptionsError(
      'serialize.contentType',
      "must be a media type string such as 'application/cbor'.",
    );
  }
  // A copy: later changes to the caller's object must not change what this wrapper stores.
  const { contentType, serialize, deserialize } = value;
  return {
    ...(contentType === undefined ? {} : { contentType }),
    serialize: (result) => serialize.call(value, result),
    deserialize: (bytes) => deserialize.call(value, bytes),
  };
}
