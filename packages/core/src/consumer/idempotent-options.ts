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
import { KeyProtocol } from '../shared/protocol';
import { type StepSettings, stepSettings } from '../shared/steps';
import type { WarningCode } from '../shared/warnings';
import { MemoryStore } from '../stores/memory-store';
import type { IdempotencyStore } from '../stores/store';
import { PermanentError } from './errors';
import type { ResultSerializer } from './result-codec';

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
  inProgress?:
    | 'reject'
    | {
        /** How long to wait for the running holder to finish before answering as `'reject'` would. */
        wait: Duration;
      };
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

/** `IdempotentOptions` after validation, with the wrapper's store (as observed), hooks and protocol. */
export interface ResolvedIdempotentOptions<Args extends unknown[], R> {
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
  /** What the steps of its calls share (`step()`). */
  steps: StepSettings;
}

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

/** The default `isPermanent`: a `PermanentError`. */
export const defaultIsPermanent = (error: unknown): boolean => error instanceof PermanentError;

/** Checks the options once (mistakes throw `IdempotencyOptionsError`) and applies their defaults. */
export function resolveIdempotentOptions<Args extends unknown[], R>(
  options: IdempotentOptions<Args, R>,
): ResolvedIdempotentOptions<Args, R> {
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
  const resolved: Omit<ResolvedIdempotentOptions<Args, R>, 'protocol' | 'steps'> = {
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
  const protocol = new KeyProtocol(resolved.store, hooks, resolved.lockTimeoutMs);
  return { ...resolved, protocol, steps: stepSettings(protocol, resolved.ttlMs, resolved.maxResultBytes) };
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
