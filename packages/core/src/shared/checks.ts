import type { IdempotencyStore } from '../stores/store';
import { parseDuration } from './duration';
import { IdempotencyOptionsError } from './errors';
import type { Logger } from './logger';

// Option checks shared by the HTTP engine's options, idempotent() and the broker wrappers.

// A lone surrogate (half of a UTF-16 pair) has no UTF-8 form: a store that keeps text as UTF-8 (Redis, PostgreSQL,
// DynamoDB) writes U+FFFD in its place, so two keys or scopes that differ only there would be one record there, and
// a fingerprint holding one would not compare equal to itself when read back.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g');

/** Whether a key or a scope would read back from a UTF-8 store as something else (see LONE_SURROGATE). */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** A fingerprint as a UTF-8 store gives it back: each lone surrogate made U+FFFD, before it is stored or compared. */
export function asStoredFingerprint<T>(fingerprint: T): T {
  return typeof fingerprint === 'string' && LONE_SURROGATE.test(fingerprint)
    ? (fingerprint.replace(LONE_SURROGATES, '\uFFFD') as T)
    : fingerprint;
}

export function checkStore(store: IdempotencyStore): IdempotencyStore {
  for (const method of ['acquire', 'complete', 'release', 'renew'] as const) {
    if (typeof store?.[method] !== 'function') {
      throw new IdempotencyOptionsError(
        'store',
        `must implement the IdempotencyStore interface (missing ${method}()); use new MemoryStore() or a store package such as @oncely/redis.`,
      );
    }
  }
  return store;
}

export function checkLogger(value: Logger): Logger {
  for (const level of ['debug', 'info', 'warn', 'error'] as const) {
    if (typeof value?.[level] !== 'function') {
      throw new IdempotencyOptionsError(
        'logger',
        `must be a pino-compatible logger with a ${level}() method.`,
      );
    }
  }
  return value;
}

/** A positive duration in whole ms; `name` is the option to blame. Exported for the broker wrappers' own options. */
export function durationOption(name: string, value: unknown): number {
  let ms: number;
  try {
    ms = parseDuration(value as string);
  } catch {
    throw new IdempotencyOptionsError(
      name,
      `must be a duration: a number of milliseconds or a string like '30s', '24h'; got ${JSON.stringify(value)}.`,
    );
  }
  if (ms < 1) throw new IdempotencyOptionsError(name, `must be at least 1ms; got ${JSON.stringify(value)}.`);
  // Whole milliseconds: stores pass these to commands (Redis PEXPIRE) that refuse fractions.
  return Math.ceil(ms);
}

export function integerOption(name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
    throw new IdempotencyOptionsError(name, `must be a positive integer; got ${JSON.stringify(value)}.`);
  }
  return value;
}

export function functionOption<F>(name: string, value: F): F {
  if (typeof value !== 'function') {
    throw new IdempotencyOptionsError(name, `must be a function; got ${typeof value}.`);
  }
  return value;
}

/** `inProgress`: `undefined` for `'reject'` (or unset), else the wait in ms. */
export function inProgressOption(value: unknown): number | undefined {
  if (value === undefined || value === 'reject') return undefined;
  if (value !== null && typeof value === 'object' && 'wait' in value) {
    return durationOption('inProgress.wait', (value as { wait: unknown }).wait);
  }
  throw new IdempotencyOptionsError(
    'inProgress',
    `must be 'reject' or { wait: duration } such as { wait: '10s' }; got ${JSON.stringify(value)}.`,
  );
}
