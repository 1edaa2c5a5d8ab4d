import { backoffDelayMs } from './retry';
import type { ConsumerRuntime, ConsumerSettledEvent } from './runtime';

// For brokers that count attempts and retry failed messages themselves, and whose worker keeps a message while it
// runs (pg-boss): the runtime decides each delivery, waits in the worker for a held key while the broker allows,
// settles through the broker's two verbs (tried again briefly on failure), and hands back to the broker what it
// must fail. The wrapper only translates its message's metadata and its verbs.

/** The broker's own retry settings for a message, when known (pg-boss: `retryLimit`, `retryDelay`, `retryBackoff`). */
export interface BrokerRetries {
  /** Retries allowed after the first attempt: a failure after `limit` earlier ones is the last. */
  limit?: number | undefined;
  /** Delay before a retry, in ms. */
  delayMs?: number | undefined;
  /** Whether the broker doubles `delayMs` after each failure (at most `maxDoublings` times). */
  backoff?: boolean | undefined;
  /** The most doublings the broker's backoff makes. Default: no limit. */
  maxDoublings?: number | undefined;
}

/** One delivery, in the runtime's terms. */
export interface WorkerDelivery {
  /** The broker's id of the message, for log lines. */
  id: string;
  /** Failed attempts the broker counted before this delivery. */
  failuresBefore: number;
  /** When the broker stops waiting for this delivery (its expiry), in ms since the epoch: waits end before. */
  expiresAt: number;
  /** Whether the worker stopped since the delivery began: a wait for a held key then ends at once. */
  stopped(): boolean;
  /** The broker's retry settings for the message, which bound how often and when it comes back. */
  retries: BrokerRetries;
}

/** The broker's two final verbs for a message. Both only touch a message still held, so a second call is harmless. */
export interface WorkerVerbs {
  /** The work is done (now, or by an earlier delivery): `result` is its result or the stored one. */
  ack(result: unknown): Promise<unknown>;
  /** No retry can help. */
  deadLetter(): Promise<unknown>;
  /** The broker's word for `deadLetter`, for log lines (`'cancelled'`). Default: `'dead-lettered'`. */
  deadLetterWord?: string;
}

/** A delivery left for the broker to fail (and retry per its own settings), with why. */
export interface HandedBack {
  /** The broker's id of the message. */
  id: string;
  /** The message's idempotency key, or `undefined` when it had none. */
  key: string | undefined;
  /** Why it is handed back, e.g. `'in-progress'` or `'failed'`. */
  reason: string;
  /** The handler's (or store's) error, when there was one. */
  error?: unknown;
}

/** Pauses before calling a verb again after it failed. */
const VERB_RETRY_MS = [100, 400, 1000];

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Decides and settles one delivery: resolves to `undefined` once it is acked or dead-lettered, or to why the broker
 * must fail it. A held key (or a store outage) is waited for in the worker, looked at again every
 * `inProgressDelay` without counting an attempt, while the delivery's expiry leaves time for one more look (and
 * that look's own wait in the store, `storeWaitMs`); after that, or once the worker stopped, it is handed back.
 */
export async function settleInWorker<M>(
  runtime: ConsumerRuntime<M>,
  storeWaitMs: number,
  msg: M,
  delivery: WorkerDelivery,
  verbs: WorkerVerbs,
): Promise<HandedBack | undefined> {
  const { log } = runtime;
  const { id, failuresBefore, expiresAt } = delivery;
  for (;;) {
    const { key, settlement, result } = await runtime.decide(msg, failuresBefore);
    switch (settlement.action) {
      case 'ack':
      case 'dead-letter': {
        if (settlement.action === 'dead-letter') {
          log.warn(
            { key, messageId: id, reason: settlement.reason, err: settlement.error },
            `oncely: message ${verbs.deadLetterWord ?? 'dead-lettered'} (no retry can help)`,
          );
        }
        try {
          await callVerb(
            runtime,
            settlement.action === 'ack' ? () => verbs.ack(result) : () => verbs.deadLetter(),
            expiresAt,
          );
        } catch (error) {
          // The message is still held, so the broker must fail it (not complete it). A done message's retry
          // replays the record; a dead-lettered one's decides the same again.
          log.error(
            { err: error, key, messageId: id },
            'oncely: could not settle a message; the broker will retry it',
          );
          runtime.report(handedBackEvent(msg, key, delivery, 'failed', error));
          return { id, key, reason: 'settle-failed', error };
        }
        runtime.report(runtime.settledEvent(msg, key, settlement, failuresBefore));
        return undefined;
      }
      case 'delay':
        // Waiting here keeps the message held without counting an attempt; it must end (with time for one more
        // look, and that look's own wait in the store) before the broker expires it.
        if (Date.now() + 2 * settlement.delayMs + storeWaitMs < expiresAt && !delivery.stopped()) {
          runtime.report(runtime.settledEvent(msg, key, settlement, failuresBefore));
          await sleep(settlement.delayMs);
          if (!delivery.stopped()) continue;
        }
        runtime.report(handedBackEvent(msg, key, delivery, settlement.reason, undefined));
        return { id, key, reason: settlement.reason };
      case 'retry':
        runtime.report(handedBackEvent(msg, key, delivery, 'failed', settlement.error));
        return { id, key, reason: settlement.reason, error: settlement.error };
    }
  }
}

/**
 * Calls a verb, trying again briefly on failure: a database blip must not turn a message whose work is done into
 * a failed attempt (on its last attempt: failed for good, though its effect happened).
 */
async function callVerb<M>(
  runtime: ConsumerRuntime<M>,
  call: () => Promise<unknown>,
  expiresAt: number,
): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await call();
      return;
    } catch (error) {
      const pause = VERB_RETRY_MS[attempt];
      if (pause === undefined || Date.now() + pause >= expiresAt) throw error;
      runtime.log.warn(
        { err: error, attempt: attempt + 1 },
        'oncely: could not settle a message; trying again',
      );
      await sleep(pause);
    }
  }
}

/**
 * The event of a delivery handed back to the broker: it counts an attempt, and either retries the message after
 * its own delay or, with its retries used up (known when the broker says its limit), fails it for good.
 */
function handedBackEvent<M>(
  msg: M,
  key: string | undefined,
  delivery: WorkerDelivery,
  reason: 'failed' | 'in-progress' | 'store-error',
  error: unknown,
): ConsumerSettledEvent<M> {
  const { failuresBefore, retries } = delivery;
  const failures = failuresBefore + 1;
  const event: ConsumerSettledEvent<M> =
    retries.limit !== undefined && failuresBefore >= retries.limit
      ? { key, action: 'dead-letter', reason: 'retries-exhausted', failures, message: msg }
      : { key, action: 'retry', reason, failures, message: msg };
  if (event.action === 'retry' && retries.delayMs !== undefined) {
    event.delayMs =
      retries.backoff === true
        ? backoffDelayMs(retries.delayMs, failures, retries.maxDoublings)
        : retries.delayMs;
  }
  if (error !== undefined) event.error = error;
  return event;
}
