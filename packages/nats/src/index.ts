/**
 * Idempotent NATS JetStream consumers for oncely: each message's work runs once per key, duplicates are acked,
 * failures are retried (`nak` with a delay), then terminated.
 *
 * @module @oncely/nats
 */
import { createHash } from 'node:crypto';
import type { JsMsg } from '@nats-io/jetstream';
import { type Duration, IdempotencyOptionsError } from '@oncely/core';
import {
  type ConsumerOptions,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  consumerRuntime,
  durationOption,
} from '@oncely/core/adapter';

/**
 * The part of a JetStream message the wrapper uses. `JsMsg` from `@nats-io/jetstream` (and from the older `nats`
 * package) has it; the handler receives your message type unchanged.
 */
export interface JetStreamMessage {
  /** The payload: hashed into the fingerprint, so a key reused for different data is caught. */
  data: Uint8Array;
  /** The message's headers, if it has any: where a key in a header (`Nats-Msg-Id` or another) is read. */
  headers?:
    | {
        /** The value of header `name`, or `''` when the message lacks it. */
        get(name: string): string;
      }
    | undefined;
  /** JetStream's delivery metadata. */
  info: {
    /** How many times the message has been delivered, this delivery included. */
    deliveryCount: number;
  };
  /** Acknowledges the message: JetStream does not redeliver it. */
  ack(): void;
  /** Asks JetStream to redeliver the message, after `millis` milliseconds when given. */
  nak(millis?: number): void;
  /** Tells JetStream never to redeliver the message, with `reason` when given. */
  term(reason?: string): void;
  /** Tells JetStream the message is still being worked on, resetting its `ack_wait` timer. */
  working(): void;
}

/** Where a message's idempotency key comes from. */
export type NatsKeySource<M extends JetStreamMessage> =
  /** The `Nats-Msg-Id` header, the id JetStream's duplicate window also uses (`js.publish(subj, data, { msgID })`). */
  | 'msgId'
  /** Another header, e.g. `{ header: 'Idempotency-Key' }`. */
  | {
      /** The header's name. */
      header: string;
    }
  /** Your own function of the message; return `undefined` when the message has no key. */
  | ((msg: M) => string | undefined);

/**
 * What the wrapper did with one delivery, for metrics and logs: `ack` (done, or a duplicate), `delay`/`retry`
 * (`nak(delayMs)`), `dead-letter` (`term()`). `failures` is JetStream's count of deliveries that ended without an ack.
 */
export type NatsSettledEvent<M extends JetStreamMessage = JsMsg> = ConsumerSettledEvent<M>;

/**
 * The shared consumer options (docs/consumers.md), and `key`, `workingInterval`, `onDeadLetter`, `termWithReason`.
 * A message without a key is terminated (after `onDeadLetter`) unless `onMissingKey: 'process'`.
 */
export interface NatsConsumerOptions<M extends JetStreamMessage = JsMsg> extends ConsumerOptions<M> {
  /** Where the key comes from. Default: `'msgId'` (the `Nats-Msg-Id` header). */
  key?: NatsKeySource<M>;
  /**
   * Sends `msg.working()` at this interval while the handler runs, so a handler slower than the consumer's
   * `ack_wait` is not redelivered meanwhile. Default: none (keep handlers shorter than `ack_wait`).
   */
  workingInterval?: Duration;
  /**
   * Called before a message is terminated, to keep it somewhere (JetStream has no dead-letter queue): publish
   * it to a dead-letter stream, for example. If it throws, the message is `nak`ed for a retry instead of lost.
   */
  onDeadLetter?: (msg: M, event: NatsSettledEvent<M>) => Promise<void> | void;
  /**
   * Sends the reason with `term()`. Needs nats-server 2.11 or later: older servers ignore a `+TERM` that carries
   * a reason and redeliver the message after `ack_wait`. Default: `false`.
   */
  termWithReason?: boolean;
}

/**
 * Wraps a JetStream message handler so that each message's work runs at most once per key across competing
 * consumers sharing `store`, and settles every delivery:
 *
 * - handler finished, or the key was already done (a duplicate) → `ack()`;
 * - the key is held by another consumer still working on it, or the store is unreachable → `nak(inProgressDelay)`;
 * - the handler threw → `nak(retryDelay)` until the delivery count reaches `maxAttempts`, then `term()`; a permanent
 *   error (`PermanentError`, `isPermanent`) is terminated at once;
 * - no key, a key reused for different data (fingerprint), or a bad key → `term()`.
 *
 * `onDeadLetter` runs before every `term()`. Use a pull consumer with `ack_policy: explicit`, and leave its
 * `max_deliver` unlimited (or above `maxAttempts`): the server stops redelivering silently at `max_deliver`.
 *
 * ```ts
 * const messages = await consumer.consume();
 * const handle = idempotentConsumer(async (msg) => { ... }, { store });
 * for await (const msg of messages) void handle(msg);
 * ```
 */
export function idempotentConsumer<M extends JetStreamMessage = JsMsg>(
  handler: (msg: M) => unknown,
  options: NatsConsumerOptions<M> = {},
): (msg: M) => Promise<void> {
  const runtime = consumerRuntime(handler, options, {
    name: '@oncely/nats',
    options: ['key', 'workingInterval', 'onDeadLetter', 'termWithReason'],
    keyOf: resolveKeySource(options?.key),
    fingerprint: dataHash,
  });
  const { log, policy } = runtime;
  const workingMs =
    options.workingInterval === undefined
      ? undefined
      : durationOption('workingInterval', options.workingInterval);
  const onDeadLetter = options.onDeadLetter;
  if (onDeadLetter !== undefined && typeof onDeadLetter !== 'function') {
    throw new IdempotencyOptionsError('onDeadLetter', `must be a function; got ${typeof onDeadLetter}.`);
  }
  const termWithReason = options.termWithReason ?? false;
  if (typeof termWithReason !== 'boolean') {
    throw new IdempotencyOptionsError(
      'termWithReason',
      `must be true or false; got ${JSON.stringify(termWithReason)}.`,
    );
  }

  /** Runs the handler, telling the server the message is still being worked on when asked to. */
  const work = async (msg: M): Promise<void> => {
    if (workingMs === undefined) {
      await handler(msg);
      return;
    }
    const timer = setInterval(() => msg.working(), workingMs);
    timer.unref();
    try {
      await handler(msg);
    } finally {
      clearInterval(timer);
    }
  };

  const settle = async (msg: M, key: string | undefined, settlement: ConsumerSettlement): Promise<void> => {
    // Every delivery before this one ended without an ack. That includes in-progress naks: see the README.
    let failures = priorDeliveries(msg);
    const event = runtime.settledEvent(msg, key, settlement, failures);
    switch (settlement.action) {
      case 'ack':
        msg.ack();
        break;
      case 'delay':
      case 'retry':
        if (settlement.action === 'retry') failures = settlement.failures;
        msg.nak(settlement.delayMs);
        break;
      case 'dead-letter': {
        if (settlement.reason === 'retries-exhausted') failures++;
        event.failures = failures;
        if (onDeadLetter !== undefined) {
          try {
            await onDeadLetter(msg, event);
          } catch (error) {
            // Terminating now would lose the message: let it come back instead.
            const delayMs = policy.retryDelayMs(Math.max(failures, 1));
            log.error({ err: error, key }, 'oncely: onDeadLetter failed; nak instead of term');
            msg.nak(delayMs);
            runtime.report({ ...event, action: 'retry', delayMs, failures, error });
            return;
          }
        }
        log.warn(
          { key, reason: settlement.reason, err: settlement.error },
          'oncely: message terminated (term)',
        );
        if (termWithReason) msg.term(`oncely: ${settlement.reason}`);
        else msg.term();
        break;
      }
    }
    event.failures = failures;
    runtime.report(event);
  };

  const handle = async (msg: M): Promise<void> => {
    const { key, settlement } = await runtime.decide(msg, priorDeliveries(msg), () => work(msg));
    await settle(msg, key, settlement);
  };

  return async (msg: M): Promise<void> => {
    try {
      await handle(msg);
    } catch (error) {
      // Only the connection can fail here; an unacked message is redelivered after ack_wait.
      log.error({ err: error }, 'oncely: could not settle a message; the server will redeliver it');
    }
  };
}

function priorDeliveries(msg: JetStreamMessage): number {
  const n = msg.info.deliveryCount;
  return Number.isSafeInteger(n) && n > 1 ? n - 1 : 0;
}

function dataHash(msg: JetStreamMessage): string {
  return createHash('sha256').update(msg.data).digest('base64url');
}

function resolveKeySource<M extends JetStreamMessage>(
  source: NatsKeySource<M> | undefined,
): (msg: M) => string | undefined {
  // MsgHdrs.get() answers '' for a header that is not there.
  const header = (name: string) => (msg: M) => msg.headers?.get(name) || undefined;
  if (source === undefined || source === 'msgId') return header('Nats-Msg-Id');
  if (typeof source === 'function') {
    return (msg) => {
      const key = source(msg);
      return typeof key === 'string' ? key : undefined;
    };
  }
  if (
    source !== null &&
    typeof source === 'object' &&
    typeof source.header === 'string' &&
    source.header !== ''
  ) {
    return header(source.header);
  }
  throw new IdempotencyOptionsError(
    'key',
    `must be 'msgId', { header: 'Idempotency-Key' } or a function (msg) => string | undefined; got ${JSON.stringify(source)}.`,
  );
}
