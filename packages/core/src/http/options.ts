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
import type { IdempotencyHooks } from '../shared/hooks';
import type { Logger } from '../shared/logger';
import { hooksOver, type ObservableOptions } from '../shared/observe';
import { MemoryStore } from '../stores/memory-store';
import type { IdempotencyStore, TransactionalIdempotencyStore } from '../stores/store';
import { ALWAYS_EXCLUDED_HEADERS, TOKEN } from './headers';

/**
 * Options shared by every adapter. `Req` is the framework's request type (Express `Request`, Fastify
 * `FastifyRequest`), passed to `scope` and `fingerprint`. The object you pass is never modified.
 */
export interface IdempotencyOptions<Req = unknown> extends ObservableOptions {
  /** Where records live. Default: a new `MemoryStore()` (one process only; use a shared store for several). */
  store?: IdempotencyStore;
  /** How long a completed response is kept and replayed. Default: `'24h'`. */
  ttl?: Duration;
  /** Lease of an in-progress record; renewed every third of it while the handler runs. Default: `'30s'`. */
  lockTimeout?: Duration;
  /** Request header carrying the key (case-insensitive). Default: `'Idempotency-Key'`. */
  header?: string;
  /** Longest key accepted; longer keys get 400. Default: `255`. */
  maxKeyLength?: number;
  /** A covered request without a key gets 400. Default: `false`, or `true` with `transactional: true`. */
  required?: boolean;
  /** Methods covered; others pass through untouched. Default: `['POST', 'PUT', 'PATCH']`. */
  methods?: readonly string[];
  /**
   * Namespace for keys (user, tenant, API key id): the same key in two scopes names two records. `false` says
   * "one namespace for everyone, on purpose" and silences the warning logged once when a covered request carries
   * `Authorization` or `Cookie` and no scope is set. `scopeByHeader('authorization', { secret })` scopes by a keyed
   * hash of a credential header. Default: none (unscoped, with that warning).
   */
  scope?: ((req: Req) => string) | false;
  /** Request fingerprint for the reuse check, or `false` to disable it. Default: method + path + query + body. */
  fingerprint?: ((req: Req) => string) | false;
  /** While the key is held: `'reject'` answers 409/429, `{ wait }` waits that long to replay. Default: `'reject'`. */
  inProgress?:
    | 'reject'
    | {
        /** How long to wait for the running holder to finish before answering as `'reject'` would. */
        wait: Duration;
      };
  /** Status for a request whose key is held by a running request. Default: `409`. */
  inProgressStatus?: 409 | 429;
  /** Which finished responses are stored; the others release the key. Default: `(status) => status < 500`. */
  cacheable?: (status: number) => boolean;
  /** Largest response body stored; a larger response is sent, kept as executed, and its replay is a 410. Default: 1 MiB. */
  maxBodyBytes?: number;
  /** Response headers never stored, added to the fixed list (set-cookie, date, hop-by-hop). Default: `[]`. */
  excludeHeaders?: readonly string[];
  /** On a store failure: `'fail-closed'` answers 503, `'fail-open'` runs the handler unprotected. Default: `'fail-closed'`. */
  onStoreError?: 'fail-closed' | 'fail-open';
  /** A pino-compatible logger. Default: none (Fastify: `request.log`). */
  logger?: Logger;
  /**
   * Observation hooks. Add-ons such as `otel()` add theirs beside these (`{ ...options, ...otel() }`), never in
   * their place. Default: none.
   */
  hooks?: IdempotencyHooks;
  /**
   * Run each execution inside a store transaction that the handler's writes join (`req.idempotency.db`), so they
   * and the stored response commit together; the response is sent only after the commit. Needs a store with
   * `acquireInTransaction` (PostgresStore). Makes `required` default to `true`. Default: `false`.
   */
  transactional?: boolean;
}

/** Options after validation, with defaults applied and durations in ms. */
export interface ResolvedOptions<Req> {
  /** The store records are kept in. */
  store: IdempotencyStore;
  /** How long a finished record is kept, in ms (`ttl`). */
  ttlMs: number;
  /** Lease of a running request, in ms (`lockTimeout`). */
  lockTimeoutMs: number;
  /** Name of the request header that carries the key, lower-cased. */
  header: string;
  /** Longest key accepted, in characters. */
  maxKeyLength: number;
  /** Whether a request without a key is refused (400) rather than run unprotected. */
  required: boolean;
  /** The request methods that are made idempotent, upper-case. */
  methods: ReadonlySet<string>;
  /** `undefined`: not set (unscoped, warns on credentials); `false`: unscoped on purpose. */
  scope: ((req: Req) => string) | false | undefined;
  /** The request fingerprint; `undefined`: the default (method + path + query + body); `false`: no reuse check. */
  fingerprint: ((req: Req) => string) | false | undefined;
  /** With `inProgress: { wait }`: how long to wait for a held key, in ms; `undefined`: reject at once. */
  waitMs: number | undefined;
  /** Status for a request whose key is held by a running request. */
  inProgressStatus: 409 | 429;
  /** Which finished responses are stored. */
  cacheable: (status: number) => boolean;
  /** Largest response body stored, in bytes. */
  maxBodyBytes: number;
  /** Response headers never stored, lower-cased: the fixed list and `excludeHeaders`. */
  excludedHeaders: ReadonlySet<string>;
  /** `true` with `onStoreError: 'fail-open'`: a store failure runs the handler unprotected. */
  failOpen: boolean;
  /** The logger, if one was given. */
  logger: Logger | undefined;
  /** The observation hooks (empty when none were given). */
  hooks: IdempotencyHooks;
  /** Whether each execution runs inside a store transaction. */
  transactional: boolean;
}

const KNOWN_OPTIONS = new Set([
  'store',
  'ttl',
  'lockTimeout',
  'header',
  'maxKeyLength',
  'required',
  'methods',
  'scope',
  'fingerprint',
  'inProgress',
  'inProgressStatus',
  'cacheable',
  'maxBodyBytes',
  'excludeHeaders',
  'onStoreError',
  'logger',
  'hooks',
  'transactional',
]);

const defaultCacheable = (status: number): boolean => status < 500;

/**
 * Validates options once and applies defaults; `base` supplies values the caller left out (a route's options
 * over its plugin's). Every mistake throws an `IdempotencyOptionsError` naming the option and the fix.
 */
export function resolveOptions<Req>(
  options: IdempotencyOptions<Req>,
  base?: ResolvedOptions<Req>,
  extraKnown?: ReadonlySet<string>,
): ResolvedOptions<Req> {
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object; pass {} or leave it out for the defaults.',
    );
  }
  for (const name of Object.keys(options)) {
    if (!KNOWN_OPTIONS.has(name) && !extraKnown?.has(name)) {
      throw new IdempotencyOptionsError(
        name,
        `is not an oncely option; known options: ${[...KNOWN_OPTIONS].join(', ')}.`,
      );
    }
  }
  const o = options;
  const resolved: ResolvedOptions<Req> = {
    store: o.store === undefined ? (base?.store ?? new MemoryStore()) : checkStore(o.store),
    ttlMs: o.ttl === undefined ? (base?.ttlMs ?? 86_400_000) : durationOption('ttl', o.ttl),
    lockTimeoutMs:
      o.lockTimeout === undefined
        ? (base?.lockTimeoutMs ?? 30_000)
        : durationOption('lockTimeout', o.lockTimeout),
    header: o.header === undefined ? (base?.header ?? 'idempotency-key') : checkHeader(o.header),
    maxKeyLength:
      o.maxKeyLength === undefined
        ? (base?.maxKeyLength ?? 255)
        : integerOption('maxKeyLength', o.maxKeyLength),
    // In transactional mode the handler writes through the request's transaction, which a keyless request does not
    // get: it is refused (400) unless `required: false` is given with it, and the handler then falls back itself.
    required:
      o.required === undefined
        ? o.transactional === true || (base?.required ?? false)
        : checkBoolean('required', o.required),
    methods:
      o.methods === undefined
        ? (base?.methods ?? new Set(['POST', 'PUT', 'PATCH']))
        : checkMethods(o.methods),
    scope: o.scope === undefined ? base?.scope : checkScope(o.scope),
    fingerprint: o.fingerprint === undefined ? base?.fingerprint : checkFingerprint(o.fingerprint),
    waitMs: o.inProgress === undefined ? base?.waitMs : inProgressOption(o.inProgress),
    inProgressStatus:
      o.inProgressStatus === undefined
        ? (base?.inProgressStatus ?? 409)
        : checkInProgressStatus(o.inProgressStatus),
    cacheable:
      o.cacheable === undefined
        ? (base?.cacheable ?? defaultCacheable)
        : functionOption('cacheable', o.cacheable),
    maxBodyBytes:
      o.maxBodyBytes === undefined
        ? (base?.maxBodyBytes ?? 1_048_576)
        : integerOption('maxBodyBytes', o.maxBodyBytes),
    excludedHeaders:
      o.excludeHeaders === undefined
        ? (base?.excludedHeaders ?? new Set(ALWAYS_EXCLUDED_HEADERS))
        : checkExcludeHeaders(o.excludeHeaders),
    failOpen: o.onStoreError === undefined ? (base?.failOpen ?? false) : checkOnStoreError(o.onStoreError),
    logger: o.logger === undefined ? base?.logger : checkLogger(o.logger),
    hooks: hooksOver(o, base?.hooks) ?? {},
    transactional:
      o.transactional === undefined
        ? (base?.transactional ?? false)
        : checkBoolean('transactional', o.transactional),
  };
  if (resolved.transactional) {
    if (
      typeof (resolved.store as Partial<TransactionalIdempotencyStore>).acquireInTransaction !== 'function'
    ) {
      throw new IdempotencyOptionsError(
        'transactional',
        'needs a store that runs transactions, such as new PostgresStore({ pool }) from @oncely/postgres.',
      );
    }
    if (resolved.failOpen) {
      throw new IdempotencyOptionsError(
        'onStoreError',
        "cannot be 'fail-open' with transactional: true, because the handler needs the store's transaction; use 'fail-closed'.",
      );
    }
  }
  return resolved;
}

function checkBoolean(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') {
    throw new IdempotencyOptionsError(name, `must be true or false; got ${JSON.stringify(value)}.`);
  }
  return value;
}

function checkScope<Req>(value: unknown): ((req: Req) => string) | false {
  if (value === false || typeof value === 'function') return value as ((req: Req) => string) | false;
  throw new IdempotencyOptionsError(
    'scope',
    `must be a function (req) => string such as (req) => req.user.id, or false for one namespace on purpose; got ${JSON.stringify(value)}.`,
  );
}

function checkHeader(value: unknown): string {
  if (typeof value !== 'string' || !TOKEN.test(value)) {
    throw new IdempotencyOptionsError(
      'header',
      `must be a valid header name like 'Idempotency-Key'; got ${JSON.stringify(value)}.`,
    );
  }
  return value.toLowerCase();
}

function checkMethods(value: unknown): ReadonlySet<string> {
  if (!Array.isArray(value) || value.some((m) => typeof m !== 'string' || !TOKEN.test(m))) {
    throw new IdempotencyOptionsError(
      'methods',
      `must be an array of HTTP methods like ['POST', 'PUT']; got ${JSON.stringify(value)}.`,
    );
  }
  return new Set(value.map((m: string) => m.toUpperCase()));
}

function checkFingerprint<Req>(value: unknown): ((req: Req) => string) | false {
  if (value === false || typeof value === 'function') return value as ((req: Req) => string) | false;
  throw new IdempotencyOptionsError(
    'fingerprint',
    `must be a function (req) => string, or false to disable the reuse check; got ${JSON.stringify(value)}.`,
  );
}

function checkInProgressStatus(value: unknown): 409 | 429 {
  if (value === 409 || value === 429) return value;
  throw new IdempotencyOptionsError('inProgressStatus', `must be 409 or 429; got ${JSON.stringify(value)}.`);
}

function checkExcludeHeaders(value: unknown): ReadonlySet<string> {
  if (!Array.isArray(value) || value.some((h) => typeof h !== 'string')) {
    throw new IdempotencyOptionsError(
      'excludeHeaders',
      `must be an array of header names like ['x-request-id']; got ${JSON.stringify(value)}.`,
    );
  }
  return new Set([...ALWAYS_EXCLUDED_HEADERS, ...value.map((h: string) => h.toLowerCase())]);
}

function checkOnStoreError(value: unknown): boolean {
  if (value === 'fail-closed') return false;
  if (value === 'fail-open') return true;
  throw new IdempotencyOptionsError(
    'onStoreError',
    `must be 'fail-closed' or 'fail-open'; got ${JSON.stringify(value)}.`,
  );
}
