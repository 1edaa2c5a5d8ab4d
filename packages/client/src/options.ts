import { IdempotentFetchOptionsError } from './errors';
import type { AttemptOutcome } from './outcome';

/** What `onRetry` is told before each retry: enough to log which operation retries, and why. */
export interface RetryEvent {
  /** The Idempotency-Key sent on every attempt of this call; `undefined` for a request sent without one (GET). */
  key: string | undefined;
  /** The request's method. */
  method: string;
  /** The request's URL. */
  url: string;
  /** The number of the attempt about to be made: 2 for the first retry. */
  attempt: number;
  /** How long the client waits before that attempt, in milliseconds (backoff, or `Retry-After` when longer). */
  delayMs: number;
  /** What happened to the attempt that just ended. */
  previous: AttemptOutcome;
}

/**
 * A duration, as the oncely server takes it: milliseconds as a number, or a number with a unit (`ms`, `s`, `m`, `h`,
 * `d`) such as `'250ms'`, `'5s'`, `'1.5 m'`.
 */
export type Duration = number | `${number}${DurationUnit}` | `${number} ${DurationUnit}`;
/** The units a duration string may end with: milliseconds, seconds, minutes, hours, days. */
export type DurationUnit = 'ms' | 's' | 'm' | 'h' | 'd';

/**
 * Options of `idempotentFetch(options)`. Every option is optional; the default is given beside each. Durations are
 * milliseconds, or strings with a unit (`'5s'`). Options are checked once, when `idempotentFetch` is called: a wrong value or an unknown name throws
 * an `IdempotentFetchOptionsError` (a `TypeError`) naming the option.
 */
export interface IdempotentFetchOptions {
  /**
   * The fetch that sends each attempt, called with one `Request`. Default: `globalThis.fetch`, looked up at each
   * call (so a fetch installed or mocked later is used).
   */
  fetch?: (request: Request) => Promise<Response>;
  /**
   * Methods that get an Idempotency-Key header when they have none, and are then retried.
   * Default: `['POST', 'PUT', 'PATCH']` (the methods an oncely server covers by default).
   */
  methods?: readonly string[];
  /**
   * Methods retried without a key because HTTP defines them as idempotent (RFC 9110, section 9.2.2). A request whose
   * method is in neither list and that carries no key is sent once. Default: `['GET', 'HEAD', 'OPTIONS', 'DELETE']`.
   */
  idempotentMethods?: readonly string[];
  /** The header that carries the key. Default: `'Idempotency-Key'`. */
  header?: string;
  /** Attempts per call, the first included; `1` never retries. Default: `5`. */
  maxAttempts?: number;
  /**
   * How long one attempt may wait for the response headers before it is abandoned (and retried). `Infinity`: no
   * limit. Default: `10_000`.
   */
  timeout?: Duration;
  /**
   * Total time for the call, every attempt and wait included: no attempt starts, and no wait begins, that would end
   * after it. `Infinity`: no limit. Default: `60_000`.
   */
  deadline?: Duration;
  /** Ceiling of the first backoff delay; full jitter picks a delay between 0 and it. Default: `250`. */
  baseDelay?: Duration;
  /** The backoff ceiling doubles per retry up to this. Default: `10_000`. */
  maxDelay?: Duration;
  /** The longest `Retry-After` honoured; a longer one is waited for this long. Default: `30_000`. */
  maxRetryAfter?: Duration;
  /**
   * Response statuses that are retried. Other statuses are returned to you as they are, never retried.
   * Default: `[409, 425, 429, 502, 503, 504]`.
   */
  retryOn?: readonly number[];
  /**
   * The largest body read into memory from a stream (a `ReadableStream` body, or the body of a `Request` you pass),
   * so that every attempt can send it again. A larger one is refused before anything is sent. Default: `1_048_576`.
   */
  maxBodyBytes?: number;
  /** Called before each retry, after the attempt that failed; an exception it throws rejects the call. Default: none. */
  onRetry?: (event: RetryEvent) => void;
  /** Random numbers in [0, 1) for the jitter; give a fixed one to make delays predictable in tests. Default: `Math.random`. */
  random?: () => number;
}

/** The options after checking, defaults applied. */
export interface ResolvedOptions {
  fetch: ((request: Request) => Promise<Response>) | undefined;
  methods: ReadonlySet<string>;
  idempotentMethods: ReadonlySet<string>;
  header: string;
  maxAttempts: number;
  timeout: number;
  deadline: number;
  baseDelay: number;
  maxDelay: number;
  maxRetryAfter: number;
  retryOn: ReadonlySet<number>;
  maxBodyBytes: number;
  onRetry: ((event: RetryEvent) => void) | undefined;
  random: () => number;
}

const KNOWN_OPTIONS = new Set<string>([
  'fetch',
  'methods',
  'idempotentMethods',
  'header',
  'maxAttempts',
  'timeout',
  'deadline',
  'baseDelay',
  'maxDelay',
  'maxRetryAfter',
  'retryOn',
  'maxBodyBytes',
  'onRetry',
  'random',
]);

// RFC 9110 token: what a method or a header name may be made of.
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

const show = (value: unknown): string => {
  if (typeof value === 'function') return 'a function';
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
};

function fail(option: string, rule: string, value: unknown): never {
  throw new IdempotentFetchOptionsError(option, `oncely: ${option} ${rule}; got ${show(value)}`);
}

function integerAtLeast(option: string, value: unknown, min: number, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min)
    fail(option, `must be an integer ≥ ${min}`, value);
  return value;
}

// The longest a timer can wait: setTimeout fires a longer delay after 1 ms (Node warns, browsers say nothing).
const MAX_TIMER_MS = 2 ** 31 - 1;

const UNIT_MS: Readonly<Record<DurationUnit, number>> = {
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};
// The server's duration syntax (parseDuration in @oncely/core), so that one value configures both ends: the number
// part is read as Number() reads it, as the Duration type does ('1e3ms', '.5h').
const DURATION = /^(.*?)\s*(ms|s|m|h|d)$/;

/**
 * Milliseconds, from a number or a string with a unit: from 0 to MAX_TIMER_MS (24.8 days), or Infinity where
 * `unlimited` allows it.
 */
function duration(option: string, value: unknown, fallback: number, unlimited: boolean): number {
  if (value === undefined) return fallback;
  let ms: number | undefined = typeof value === 'number' ? value : undefined;
  if (typeof value === 'string') {
    const match = DURATION.exec(value.trim());
    const amount = match && match[1] !== '' ? Number(match[1]) : Number.NaN;
    if (match && Number.isFinite(amount)) ms = Math.round(amount * UNIT_MS[match[2] as DurationUnit]) || 0;
  }
  const ok = ms !== undefined && ms >= 0 && (ms <= MAX_TIMER_MS || (unlimited && ms === Infinity));
  if (!ok)
    fail(
      option,
      `must be a duration from 0 to ${MAX_TIMER_MS} ms (24.8 days, the longest a timer waits): milliseconds or a string with a unit such as '5s'${unlimited ? ', or Infinity for no limit' : ''}`,
      value,
    );
  return ms as number;
}

function methodSet(option: string, value: unknown, fallback: readonly string[]): ReadonlySet<string> {
  if (value === undefined) return new Set(fallback);
  if (!Array.isArray(value) || !value.every((m) => typeof m === 'string' && TOKEN.test(m)))
    fail(option, "must be an array of HTTP method names, such as ['POST', 'PUT']", value);
  return new Set((value as string[]).map((m) => m.toUpperCase()));
}

function functionOrUndefined<F>(option: string, value: unknown): F | undefined {
  if (value !== undefined && typeof value !== 'function') fail(option, 'must be a function', value);
  return value as F | undefined;
}

export function resolveOptions(options: IdempotentFetchOptions | undefined): ResolvedOptions {
  if (options === undefined) options = {};
  if (options === null || typeof options !== 'object' || Array.isArray(options))
    throw new IdempotentFetchOptionsError(
      'options',
      `oncely: idempotentFetch(options) takes an object of options, or nothing; got ${show(options)}`,
    );
  for (const name of Object.keys(options))
    if (!KNOWN_OPTIONS.has(name))
      throw new IdempotentFetchOptionsError(
        name,
        `oncely: unknown option ${JSON.stringify(name)}; the options are ${[...KNOWN_OPTIONS].join(', ')}`,
      );

  const fetch = functionOrUndefined<(request: Request) => Promise<Response>>('fetch', options.fetch);
  if (fetch === undefined && typeof globalThis.fetch !== 'function')
    throw new IdempotentFetchOptionsError(
      'fetch',
      'oncely: there is no globalThis.fetch here; pass one: idempotentFetch({ fetch })',
    );

  const header = options.header ?? 'Idempotency-Key';
  if (typeof header !== 'string' || !TOKEN.test(header))
    fail('header', "must be a header name, such as 'Idempotency-Key'", header);

  let retryOn: ReadonlySet<number> = new Set([409, 425, 429, 502, 503, 504]);
  if (options.retryOn !== undefined) {
    const statuses: unknown = options.retryOn;
    if (
      !Array.isArray(statuses) ||
      !statuses.every((s) => typeof s === 'number' && Number.isInteger(s) && s >= 400 && s <= 599)
    )
      fail('retryOn', 'must be an array of HTTP error statuses (integers 400 to 599)', statuses);
    retryOn = new Set(statuses as number[]);
  }

  const baseDelay = duration('baseDelay', options.baseDelay, 250, false);
  const maxDelay = duration('maxDelay', options.maxDelay, 10_000, false);
  if (maxDelay < baseDelay)
    fail('maxDelay', `must be ≥ baseDelay (${baseDelay}); raise it or lower baseDelay`, maxDelay);

  const maxBodyBytes = options.maxBodyBytes;
  if (
    maxBodyBytes !== undefined &&
    !(
      typeof maxBodyBytes === 'number' &&
      maxBodyBytes >= 0 &&
      (Number.isInteger(maxBodyBytes) || maxBodyBytes === Infinity)
    )
  )
    fail('maxBodyBytes', 'must be an integer ≥ 0 (bytes), or Infinity', maxBodyBytes);

  const timeout = duration('timeout', options.timeout, 10_000, true);
  if (timeout === 0) fail('timeout', 'must be > 0 (Infinity for no timeout)', timeout);
  const deadline = duration('deadline', options.deadline, 60_000, true);
  if (deadline === 0) fail('deadline', 'must be > 0 (Infinity for no deadline)', deadline);

  return {
    fetch,
    methods: methodSet('methods', options.methods, ['POST', 'PUT', 'PATCH']),
    idempotentMethods: methodSet('idempotentMethods', options.idempotentMethods, [
      'GET',
      'HEAD',
      'OPTIONS',
      'DELETE',
    ]),
    header,
    maxAttempts: integerAtLeast('maxAttempts', options.maxAttempts, 1, 5),
    timeout,
    deadline,
    baseDelay,
    maxDelay,
    maxRetryAfter: duration('maxRetryAfter', options.maxRetryAfter, 30_000, false),
    retryOn,
    maxBodyBytes: maxBodyBytes ?? 1_048_576,
    onRetry: functionOrUndefined('onRetry', options.onRetry),
    random: functionOrUndefined<() => number>('random', options.random) ?? Math.random,
  };
}
