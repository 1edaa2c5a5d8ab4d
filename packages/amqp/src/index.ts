/**
 * Idempotent RabbitMQ consumers for oncely, on amqplib: each message's work runs once per key, duplicates are
 * acked, failures are retried through delay queues, then dead-lettered.
 *
 * @module @oncely/amqp
 */
import { createHash } from 'node:crypto';
import { IdempotencyOptionsError } from '@oncely/core';
import {
  type ConsumerOptions,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  consumerRuntime,
} from '@oncely/core/adapter';
import type { ConfirmChannel, ConsumeMessage, Options } from 'amqplib';

/** Where a message's idempotency key comes from. */
export type AmqpKeySource =
  /** `properties.messageId`, as the producer set it (`publish(..., { messageId })`). */
  | 'messageId'
  /** A message header, e.g. `{ header: 'Idempotency-Key' }` (exact name first, then case-insensitive). */
  | {
      /** The header's name. */
      header: string;
    }
  /** Your own function of the message; return `undefined` when the message has no key. */
  | ((msg: ConsumeMessage) => string | undefined);

/**
 * What the wrapper did with one delivery, for metrics and logs: `ack` (done, or a duplicate), `delay`/`retry`
 * (re-queued through the delay queue), `dead-letter` (nacked without requeue).
 */
export type AmqpSettledEvent = ConsumerSettledEvent<ConsumeMessage>;

/**
 * The shared consumer options (docs/consumers.md), and `key` and `delayQueueArguments`. A message without a key is
 * nacked without requeue (to the queue's dead-letter exchange) unless `onMissingKey: 'process'`.
 */
export interface AmqpConsumerOptions extends ConsumerOptions<ConsumeMessage> {
  /**
   * The confirm channel the callback consumes on (`await connection.createConfirmChannel()`): delayed messages are
   * re-published on it, and the original is acked only once the broker confirms the copy. Required.
   */
  channel: ConfirmChannel;
  /** The queue the callback consumes from: delayed and retried messages are routed back to it. Required. */
  queue: string;
  /** Where the key comes from. Default: `'messageId'`. */
  key?: AmqpKeySource;
  /** Extra arguments for the delay queues (e.g. `{ 'x-queue-type': 'quorum' }`). Default: none. */
  delayQueueArguments?: Readonly<Record<string, unknown>>;
}

/** Header carrying the failed attempts of a message re-published for a retry. */
export const FAILURES_HEADER = 'x-oncely-failures';
/** Header recording the exchange a re-published message was first published to. */
export const ORIGINAL_EXCHANGE_HEADER = 'x-oncely-original-exchange';
/** Header recording the routing key a re-published message was first published with. */
export const ORIGINAL_ROUTING_KEY_HEADER = 'x-oncely-original-routing-key';

/**
 * The delay queue for `queue` and a delay: messages wait there `delayMs`, then dead-letter back to `queue`. One
 * queue per delay, so every message in it has the same TTL and they expire in order (per-message TTLs of different
 * lengths would wait behind the queue's head).
 */
export function delayQueueName(queue: string, delayMs: number): string {
  return `${queue}.oncely-delay.${delayMs}ms`;
}

// Never copied onto a re-published message: expiration would fight the delay queue's TTL, a user-id must match
// the publishing connection's user, and a quorum queue's delivery count belongs to the old copy (it is folded
// into the failures header instead).
const DROPPED_PROPERTIES = new Set(['expiration', 'userId', 'clusterId', 'headers']);

/**
 * Wraps a consume callback so that each message's work runs at most once per key across competing consumers
 * sharing `store`, and settles every delivery:
 *
 * - handler finished, or the key was already done (a duplicate) → `ack`;
 * - the key is held by another consumer still working on it, or the store is unreachable → the message is
 *   re-published to a delay queue (`delayQueueName`) that dead-letters it back to `queue` after `inProgressDelay`,
 *   then acked: no hot redelivery loop, no prefetch slot held;
 * - the handler threw → re-published through the delay queue after `retryDelay`, with the failures so far in
 *   the `x-oncely-failures` header, until `maxAttempts`; then `nack` without requeue (to the queue's dead-letter
 *   exchange); a permanent error (`PermanentError`, `isPermanent`) goes there at once;
 * - no key, a key reused for a different body (fingerprint), or a bad key → dead-lettered.
 *
 * A message is acked only once its work finished, or once its copy is confirmed in the delay queue. `channel`
 * must be a confirm channel (`connection.createConfirmChannel()`), and the one the callback consumes on:
 *
 * ```ts
 * await channel.consume('orders', idempotentConsumer(handler, { channel, queue: 'orders', store }));
 * ```
 *
 * The arguments come in the order of every oncely wrapper: the handler, then the options.
 */
export function idempotentConsumer(
  handler: (msg: ConsumeMessage) => unknown,
  options: AmqpConsumerOptions,
): (msg: ConsumeMessage | null) => Promise<void> {
  const { channel, queue } = (options ?? {}) as Partial<AmqpConsumerOptions>;
  if (
    channel === null ||
    typeof channel !== 'object' ||
    typeof channel.ack !== 'function' ||
    typeof channel.waitForConfirms !== 'function'
  ) {
    throw new IdempotencyOptionsError(
      'channel',
      'must be an amqplib confirm channel (await connection.createConfirmChannel()): delayed messages are re-published, and the original is acked only once the broker confirms the copy.',
    );
  }
  if (typeof queue !== 'string' || queue.length === 0) {
    throw new IdempotencyOptionsError(
      'queue',
      'must be the name of the queue you consume from: delayed and retried messages are routed back to it.',
    );
  }
  const runtime = consumerRuntime(handler, options, {
    name: '@oncely/amqp',
    options: ['channel', 'queue', 'key', 'delayQueueArguments'],
    keyOf: resolveKeySource(options?.key),
    fingerprint: bodyHash,
  });
  const { log } = runtime;
  const delayArguments = checkDelayArguments(options.delayQueueArguments);

  const settle = async (msg: ConsumeMessage, key: string | undefined, settlement: ConsumerSettlement) => {
    const failuresBefore = failuresOf(msg);
    let failures = failuresBefore;
    switch (settlement.action) {
      case 'ack':
        channel.ack(msg);
        break;
      case 'dead-letter':
        log.warn(
          { key, reason: settlement.reason, err: settlement.error },
          'oncely: message dead-lettered (nack without requeue)',
        );
        if (settlement.reason === 'retries-exhausted') failures++;
        channel.nack(msg, false, false);
        break;
      case 'delay':
      case 'retry':
        if (settlement.action === 'retry') failures = settlement.failures;
        await requeueLater(msg, settlement.delayMs, failures);
        break;
    }
    runtime.report(runtime.settledEvent(msg, key, settlement, failures));
  };

  const requeueLater = async (msg: ConsumeMessage, delayMs: number, failures: number) => {
    const target = delayQueueName(queue, delayMs);
    try {
      // Declared before every publish: declaring renews x-expires, so the queue outlives the message it holds.
      await channel.assertQueue(target, {
        durable: true,
        // The user's extras first: the routing back to `queue` and the TTLs are what make this a delay queue.
        arguments: {
          ...delayArguments,
          'x-message-ttl': delayMs,
          'x-dead-letter-exchange': '',
          'x-dead-letter-routing-key': queue,
          'x-expires': delayMs * 2 + 60_000,
        },
      });
      await new Promise<void>((resolve, reject) => {
        channel.publish('', target, msg.content, copyProperties(msg, failures), (error: unknown) =>
          error ? reject(error) : resolve(),
        );
      });
    } catch (error) {
      // The copy is not safely queued, so the original must not be acked. Hold it for the delay, then requeue it:
      // still no hot loop, and if this channel is gone the broker requeues it by itself.
      log.error(
        { err: error, queue: target },
        'oncely: could not re-publish to the delay queue; requeueing later',
      );
      setTimeout(() => {
        try {
          channel.nack(msg, false, true);
        } catch {
          // channel closed: the broker has requeued the message already
        }
      }, delayMs).unref();
      return;
    }
    channel.ack(msg);
  };

  const handle = async (msg: ConsumeMessage): Promise<void> => {
    const { key, settlement } = await runtime.decide(msg, failuresOf(msg));
    await settle(msg, key, settlement);
  };

  return async (msg: ConsumeMessage | null): Promise<void> => {
    if (msg === null) {
      log.warn({ queue }, 'oncely: the broker cancelled the consumer (queue deleted or failed over)');
      return;
    }
    try {
      await handle(msg);
    } catch (error) {
      // Only the channel can fail here (ack/nack on a closed channel); the broker redelivers unacked messages.
      log.error({ err: error, queue }, 'oncely: could not settle a message; the broker will redeliver it');
    }
  };
}

/** Failed attempts so far: our header, plus a quorum queue's count of deliveries that ended without an ack. */
function failuresOf(msg: ConsumeMessage): number {
  const headers = msg.properties.headers ?? {};
  return count(headers[FAILURES_HEADER]) + count(headers['x-delivery-count']);
}

function count(value: unknown): number {
  const n = typeof value === 'number' ? value : typeof value === 'string' ? Number.parseInt(value, 10) : 0;
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

function copyProperties(msg: ConsumeMessage, failures: number): Options.Publish {
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(msg.properties)) {
    if (value !== undefined && !DROPPED_PROPERTIES.has(name)) out[name] = value;
  }
  const headers: Record<string, unknown> = { ...(msg.properties.headers ?? {}) };
  delete headers['x-delivery-count'];
  headers[FAILURES_HEADER] = failures;
  // Delayed copies come back through the default exchange; keep where the message was first published.
  headers[ORIGINAL_EXCHANGE_HEADER] ??= msg.fields.exchange;
  headers[ORIGINAL_ROUTING_KEY_HEADER] ??= msg.fields.routingKey;
  out.headers = headers;
  return out as Options.Publish;
}

function bodyHash(msg: ConsumeMessage): string {
  return createHash('sha256').update(msg.content).digest('base64url');
}

function resolveKeySource(source: AmqpKeySource | undefined): (msg: ConsumeMessage) => string | undefined {
  if (source === undefined || source === 'messageId') {
    return (msg) => stringOf(msg.properties.messageId);
  }
  if (typeof source === 'function') return (msg) => stringOf(source(msg));
  if (
    source !== null &&
    typeof source === 'object' &&
    typeof source.header === 'string' &&
    source.header !== ''
  ) {
    const name = source.header;
    const lower = name.toLowerCase();
    return (msg) => {
      const headers = msg.properties.headers;
      if (headers === undefined) return undefined;
      if (headers[name] !== undefined) return stringOf(headers[name]);
      for (const [n, value] of Object.entries(headers)) if (n.toLowerCase() === lower) return stringOf(value);
      return undefined;
    };
  }
  throw new IdempotencyOptionsError(
    'key',
    `must be 'messageId', { header: 'Idempotency-Key' } or a function (msg) => string | undefined; got ${JSON.stringify(source)}.`,
  );
}

function stringOf(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (typeof value === 'number') return String(value);
  if (value instanceof Uint8Array) return Buffer.from(value).toString('utf8');
  return undefined;
}

function checkDelayArguments(value: unknown): Record<string, unknown> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new IdempotencyOptionsError(
      'delayQueueArguments',
      `must be an object of queue arguments such as { 'x-queue-type': 'quorum' }; got ${JSON.stringify(value)}.`,
    );
  }
  return { ...(value as Record<string, unknown>) };
}
