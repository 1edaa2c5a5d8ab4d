import { durationOption, functionOption, integerOption } from '../shared/checks';
import type { Duration } from '../shared/duration';
import { type Logger, silentLogger } from '../shared/logger';
import {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyStoreError,
  PermanentError,
  UnstorableResultError,
} from './errors';
import { defaultIsPermanent } from './idempotent-options';

/**
 * How the broker wrappers retry: the one policy `@oncely/amqp` and `@oncely/nats` share, exported so that other
 * consumers (Kafka, SQS: see docs/consumers.md) can settle messages the same way.
 */
export interface ConsumerRetryOptions {
  /** Attempts a message gets before it is dead-lettered; the first delivery is attempt 1. Default: `5`. */
  maxAttempts?: number;
  /** Delay before a failed message is tried again, or a function of the failures so far. Default: 1s doubling, at most 60s. */
  retryDelay?: Duration | ((failures: number) => Duration);
  /** Delay before a message whose key is held by a running call is looked at again. Default: `'1s'`. */
  inProgressDelay?: Duration;
  /** Which errors no retry can fix: dead-lettered at once, and stored so duplicates are too. Default: `PermanentError`. */
  isPermanent?: (error: unknown) => boolean;
}

/** `ConsumerRetryOptions` after validation. */
export interface ConsumerRetryPolicy {
  /** Attempts a message gets before it is dead-lettered. */
  maxAttempts: number;
  /** Delay before a message whose key is held is looked at again, in ms. */
  inProgressDelayMs: number;
  /** Which errors no retry can fix. */
  isPermanent: (error: unknown) => boolean;
  /** The delay after the `failures`-th failure, in ms (a bad value from a `retryDelay` function falls back to the default). */
  retryDelayMs(failures: number): number;
}

/** What to do with a message, in broker-neutral words. */
export type ConsumerSettlement =
  /** The work is done (now, or by an earlier delivery): acknowledge. */
  | {
      /** What to do with the message. */
      action: 'ack';
      /** Why: it ran now, ran before, or ran but its result could not be stored. */
      reason: 'executed' | 'replayed' | 'unstorable';
    }
  /** Nothing ran; look at the message again after `delayMs` without counting a failure. */
  | {
      /** What to do with the message. */
      action: 'delay';
      /** Why: its key is held by a running call, or the store failed. */
      reason: 'in-progress' | 'store-error';
      /** How long to wait before the message is looked at again, in ms. */
      delayMs: number;
    }
  /** The work failed `failures` times so far; try again after `delayMs`. */
  | {
      /** What to do with the message. */
      action: 'retry';
      /** Why: the work threw. */
      reason: 'failed';
      /** How long to wait before the next attempt, in ms. */
      delayMs: number;
      /** How many times the work failed so far, this one included. */
      failures: number;
      /** What the work threw. */
      error: unknown;
    }
  /** No retry can help: hand the message to the dead-letter destination. */
  | {
      /** What to do with the message. */
      action: 'dead-letter';
      /** Why no retry can help. */
      reason: 'permanent' | 'mismatch' | 'invalid-key' | 'missing-key' | 'retries-exhausted';
      /** The error that decided it, when there is one. */
      error?: unknown;
    };

const CONSUMER_OPTIONS = ['maxAttempts', 'retryDelay', 'inProgressDelay', 'isPermanent'] as const;

/**
 * Exponential backoff: `baseMs` after the first failure, doubled after each further one, at most `maxDoublings`
 * times and at most `maxMs`.
 */
export function backoffDelayMs(
  baseMs: number,
  failures: number,
  maxDoublings = Number.POSITIVE_INFINITY,
  maxMs = Number.POSITIVE_INFINITY,
): number {
  return Math.min(baseMs * 2 ** Math.min(Math.max(failures - 1, 0), maxDoublings), maxMs);
}

const defaultRetryDelayMs = (failures: number): number => backoffDelayMs(1000, failures, undefined, 60_000);

/** Validates the retry options (throwing `IdempotencyOptionsError`) and applies their defaults. */
export function resolveConsumerRetryPolicy(
  options: ConsumerRetryOptions,
  logger?: Logger,
): ConsumerRetryPolicy {
  const log = logger ?? silentLogger;
  const maxAttempts =
    options.maxAttempts === undefined ? 5 : integerOption('maxAttempts', options.maxAttempts);
  const inProgressDelayMs =
    options.inProgressDelay === undefined ? 1000 : durationOption('inProgressDelay', options.inProgressDelay);
  const isPermanent =
    options.isPermanent === undefined
      ? defaultIsPermanent
      : functionOption('isPermanent', options.isPermanent);
  const retryDelay = options.retryDelay;
  let retryDelayMs: (failures: number) => number;
  if (retryDelay === undefined) {
    retryDelayMs = defaultRetryDelayMs;
  } else if (typeof retryDelay === 'function') {
    retryDelayMs = (failures) => {
      try {
        return durationOption('retryDelay', retryDelay(failures));
      } catch (error) {
        log.error(
          { err: error, failures },
          'oncely: retryDelay() failed or gave no duration; using the default',
        );
        return defaultRetryDelayMs(failures);
      }
    };
  } else {
    const ms = durationOption('retryDelay', retryDelay);
    retryDelayMs = () => ms;
  }
  return { maxAttempts, inProgressDelayMs, isPermanent, retryDelayMs };
}

/** The names `resolveConsumerRetryPolicy` reads, for a wrapper's unknown-option check. */
export const CONSUMER_RETRY_OPTIONS: readonly string[] = CONSUMER_OPTIONS;

/**
 * Settles a message whose idempotent call threw `error`, after `failuresBefore` earlier failed attempts. A broker
 * wrapper maps the answer to its own verbs (ack, delayed requeue, nack to the dead-letter exchange, term).
 */
export function settlementFor(
  policy: ConsumerRetryPolicy,
  error: unknown,
  failuresBefore: number,
  /**
   * `true` when the work itself threw `error`. Then even one of oncely's own errors (an inner `idempotent()` call's
   * in-progress or unstorable error) is the work failing, not this message's key: retried or dead-lettered, never
   * acked or delayed for ever. Default: `false`.
   */
  thrownByWork = false,
): ConsumerSettlement {
  if (thrownByWork) return failureSettlement(policy, error, failuresBefore);
  if (error instanceof IdempotencyInProgressError) {
    return { action: 'delay', reason: 'in-progress', delayMs: policy.inProgressDelayMs };
  }
  if (error instanceof IdempotencyStoreError) {
    return { action: 'delay', reason: 'store-error', delayMs: policy.inProgressDelayMs };
  }
  // The work ran once; only its (unused) result was not kept. Acking is right: redelivery would only replay this.
  if (error instanceof UnstorableResultError) return { action: 'ack', reason: 'unstorable' };
  if (error instanceof IdempotencyMismatchError) return { action: 'dead-letter', reason: 'mismatch', error };
  if (error instanceof IdempotencyKeyError) return { action: 'dead-letter', reason: 'invalid-key', error };
  return failureSettlement(policy, error, failuresBefore);
}

/** The work failed with `error`: dead-letter when permanent or out of attempts, else retry after the policy's delay. */
function failureSettlement(
  policy: ConsumerRetryPolicy,
  error: unknown,
  failuresBefore: number,
): ConsumerSettlement {
  let permanent = error instanceof PermanentError;
  if (!permanent) {
    try {
      permanent = policy.isPermanent(error) === true;
    } catch {
      permanent = false;
    }
  }
  if (permanent) return { action: 'dead-letter', reason: 'permanent', error };
  const failures = failuresBefore + 1;
  if (failures >= policy.maxAttempts) return { action: 'dead-letter', reason: 'retries-exhausted', error };
  return { action: 'retry', reason: 'failed', delayMs: policy.retryDelayMs(failures), failures, error };
}
