import { createHash } from 'node:crypto';
import type { JsMsg } from '@nats-io/jetstream';
import {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerRetryOptions,
  type ConsumerSettlement,
  type Duration,
  durationOption,
  IdempotencyKeyError,
  IdempotencyOptionsError,
  type IdempotencyStore,
  idempotentOutcome,
  type Logger,
  resolveConsumerRetryPolicy,
  settlementFor,
  silentLogger,
} from '@oncely/core';

/**
 * The part of a JetStream message the wrapper uses. `JsMsg` from `@nats-io/jetstream` (and from the older `nats`
 * package) has it; the handler receives your message type unchanged.
 */
export interface JetStreamMessage {
  data: Uint8Array;
  headers?: { get(name: string): string } | undefined;
  info: { deliveryCount: number };
  ack(): void;
  nak(millis?: number): void;
  term(reason?: string): void;
  working(): void;
}

/** Where a message's idempotency key comes from. */
export type NatsKeySource<M extends JetStreamMessage> =
  /** The `Nats-Msg-Id` header, the id JetStream's duplicate window also uses (`js.publish(subj, data, { msgID })`). */
  | 'msgId'
  /** Another header, e.g. `{ header: 'Idempotency-Key' }`. */
  | { header: string }
  /** Your own function of the message; return `undefined` when the message has no key. */
  | ((msg: M) => string | undefined);

/** What the wrapper did with one delivery, for metrics and logs. */
export interface NatsSettledEvent<M extends JetStreamMessage = JsMsg> {
  /** The idempotency key, or `undefined` when the message had none. */
  key: string | undefined;
  /** `ack`: done (or a duplicate); `delay`/`retry`: `nak(delayMs)`; `dead-letter`: `term()`. */
  action: ConsumerSettlement['action'];
  reason: ConsumerSettlement['reason'];
  /** Failed deliveries counted so far (after this one): JetStream's delivery count. */
  failures: number;
  /** The delay asked of the server, for `delay` and `retry`. */
  delayMs?: number;
  /** The handler's (or store's) error, when there was one. */
  error?: unknown;
  message: M;
}

export interface NatsConsumerOptions<M extends JetStreamMessage = JsMsg> extends ConsumerRetryOptions {
  /** Where records live. Default: a new `MemoryStore()` (one process; competing consumers need a shared store). */
  store?: IdempotencyStore;
  /** Where the key comes from. Default: `'msgId'` (the `Nats-Msg-Id` header). */
  key?: NatsKeySource<M>;
  /**
   * A message without a key: `'dead-letter'` terminates it (after `onDeadLetter`); `'process'` runs the handler
   * without idempotency protection. Default: `'dead-letter'`.
   */
  onMissingKey?: 'dead-letter' | 'process';
  /** What must match when a key is reused (else dead-letter), or `false`. Default: SHA-256 of the message data. */
  fingerprint?: ((msg: M) => string) | false;
  /** How long a finished message's record is kept: duplicates within it are acked without running. Default: `'24h'`. */
  ttl?: Duration;
  /** Lease of a message being processed, renewed while the handler runs. Default: `'30s'`. */
  lockTimeout?: Duration;
  /** While another consumer processes the key: `'reject'` naks with a delay; `{ wait }` waits in-process first. */
  inProgress?: 'reject' | { wait: Duration };
  /** Longest key accepted; longer keys are dead-lettered. Default: `255`. */
  maxKeyLength?: number;
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
  /** A pino-compatible logger. Default: none. */
  logger?: Logger;
  /** Called after each delivery is settled. Exceptions are logged and ignored. */
  onSettled?: (event: NatsSettledEvent<M>) => void;
}

const KNOWN_OPTIONS = new Set([
  'store',
  'key',
  'onMissingKey',
  'fingerprint',
  'ttl',
  'lockTimeout',
  'inProgress',
  'maxKeyLength',
  'workingInterval',
  'onDeadLetter',
  'termWithReason',
  'logger',
  'onSettled',
  ...CONSUMER_RETRY_OPTIONS,
]);

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
  if (typeof handler !== 'function') {
    throw new IdempotencyOptionsError('handler', `must be a function (msg) => work; got ${typeof handler}.`);
  }
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object; pass {} or leave it out for the defaults.',
    );
  }
  for (const name of Object.keys(options)) {
    if (!KNOWN_OPTIONS.has(name)) {
      throw new IdempotencyOptionsError(
        name,
        `is not an option of @oncely/nats; known options: ${[...KNOWN_OPTIONS].join(', ')}.`,
      );
    }
  }
  const log = options.logger ?? silentLogger;
  const policy = resolveConsumerRetryPolicy(options, log);
  const keyOf = resolveKeySource(options.key);
  const processWithoutKey = checkOnMissingKey(options.onMissingKey);
  const workingMs =
    options.workingInterval === undefined
      ? undefined
      : durationOption('workingInterval', options.workingInterval);
  const onDeadLetter = checkOptionalFunction('onDeadLetter', options.onDeadLetter);
  const onSettled = checkOptionalFunction('onSettled', options.onSettled);
  const termWithReason = options.termWithReason ?? false;
  if (typeof termWithReason !== 'boolean') {
    throw new IdempotencyOptionsError(
      'termWithReason',
      `must be true or false; got ${JSON.stringify(termWithReason)}.`,
    );
  }
  const fingerprint = options.fingerprint;
  if (fingerprint !== undefined && fingerprint !== false && typeof fingerprint !== 'function') {
    throw new IdempotencyOptionsError(
      'fingerprint',
      `must be a function (msg) => string, or false to disable the check; got ${typeof fingerprint}.`,
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

  // The handler's own result is not a consumer's business: `null` is what gets stored, so any handler fits.
  const run = idempotentOutcome(
    async (msg: M, _key: string) => {
      await work(msg);
      return null;
    },
    {
      key: (_msg, key) => key,
      fingerprint:
        fingerprint === false
          ? false
          : (msg) => (fingerprint === undefined ? dataHash(msg) : fingerprint(msg)),
      isPermanent: policy.isPermanent,
      ...(options.store === undefined ? {} : { store: options.store }),
      ...(options.ttl === undefined ? {} : { ttl: options.ttl }),
      ...(options.lockTimeout === undefined ? {} : { lockTimeout: options.lockTimeout }),
      ...(options.inProgress === undefined ? {} : { inProgress: options.inProgress }),
      ...(options.maxKeyLength === undefined ? {} : { maxKeyLength: options.maxKeyLength }),
      ...(options.logger === undefined ? {} : { logger: options.logger }),
    },
  );

  const settle = async (msg: M, key: string | undefined, settlement: ConsumerSettlement): Promise<void> => {
    // Every delivery before this one ended without an ack. That includes in-progress naks: see the README.
    let failures = priorDeliveries(msg);
    const event: NatsSettledEvent<M> = {
      key,
      action: settlement.action,
      reason: settlement.reason,
      failures,
      message: msg,
    };
    if ('error' in settlement && settlement.error !== undefined) event.error = settlement.error;
    switch (settlement.action) {
      case 'ack':
        msg.ack();
        break;
      case 'delay':
      case 'retry':
        if (settlement.action === 'retry') failures = settlement.failures;
        event.delayMs = settlement.delayMs;
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
            report({ ...event, action: 'retry', delayMs, failures, error });
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
    report(event);
  };

  const report = (event: NatsSettledEvent<M>): void => {
    if (onSettled === undefined) return;
    try {
      onSettled(event);
    } catch (error) {
      log.error({ err: error }, 'oncely: onSettled threw; ignored');
    }
  };

  const handle = async (msg: M): Promise<void> => {
    let key: string | undefined;
    try {
      key = keyOf(msg);
    } catch (error) {
      await settle(msg, undefined, {
        action: 'dead-letter',
        reason: 'invalid-key',
        error: new IdempotencyKeyError('the key function threw', { cause: error }),
      });
      return;
    }
    if (key === undefined || key === '') {
      if (!processWithoutKey) {
        await settle(msg, undefined, { action: 'dead-letter', reason: 'missing-key' });
        return;
      }
      log.warn({}, 'oncely: message without an idempotency key processed WITHOUT protection');
      try {
        await work(msg);
        await settle(msg, undefined, { action: 'ack', reason: 'executed' });
      } catch (error) {
        await settle(msg, undefined, settlementFor(policy, error, priorDeliveries(msg)));
      }
      return;
    }
    let settlement: ConsumerSettlement;
    try {
      const { outcome } = await run(msg, key);
      settlement = { action: 'ack', reason: outcome };
    } catch (error) {
      settlement = settlementFor(policy, error, priorDeliveries(msg));
    }
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

function checkOnMissingKey(value: unknown): boolean {
  if (value === undefined || value === 'dead-letter') return false;
  if (value === 'process') return true;
  throw new IdempotencyOptionsError(
    'onMissingKey',
    `must be 'dead-letter' or 'process'; got ${JSON.stringify(value)}.`,
  );
}

function checkOptionalFunction<F>(name: string, value: F | undefined): F | undefined {
  if (value !== undefined && typeof value !== 'function') {
    throw new IdempotencyOptionsError(name, `must be a function; got ${typeof value}.`);
  }
  return value;
}
