/**
 * Idempotent Amazon SQS consumers for oncely, for sqs-consumer (`handleMessage`, `handleMessageBatch`) and plain
 * `ReceiveMessage` loops: each message's work runs once per key; duplicates are deleted, failures retried through
 * the visibility timeout (ChangeMessageVisibility), then sent to a dead-letter queue or left to the queue's redrive
 * policy.
 *
 * @module @oncely/sqs
 */
import type { Message, MessageAttributeValue, SQSClient } from '@aws-sdk/client-sqs';
import { type Duration, IdempotencyOptionsError } from '@oncely/core';
import {
  type ConsumerOptions,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  consumerRuntime,
  durationOption,
} from '@oncely/core/adapter';
import { inGroupOrder, type SqsKeySource, sqsFingerprint, sqsKeyOf, viewOfSdkMessage } from './records';

export {
  DEFAULT_KEY_ATTRIBUTE,
  type SqsKeySource,
  type SqsMessageView,
  sqsFingerprint,
  sqsKeyOf,
  viewOfSdkMessage,
} from './records';

/**
 * What the wrapper did with one message, for metrics and logs: `ack` (deleted, or handed back to sqs-consumer to
 * delete), `delay`/`retry` (its visibility set to come back after `delayMs`), `dead-letter` (sent to
 * `deadLetterQueueUrl` and deleted, or left to the queue's redrive policy). A message not run because an earlier
 * message of its FIFO group (standard queue: with its key) in the same receive was not acknowledged is a `delay`
 * with reason `group-stopped`.
 */
export type SqsSettledEvent =
  | ConsumerSettledEvent<Message>
  | (Omit<ConsumerSettledEvent<Message>, 'action' | 'reason'> & {
      /** The message was not run; it comes back after `delayMs`. */
      action: 'delay';
      /** An earlier message of its FIFO group (standard queue: with its key) was not acknowledged. */
      reason: 'group-stopped';
    });

/** The shared consumer options (docs/consumers.md), and SQS's own. */
export interface SqsConsumerOptions extends ConsumerOptions<Message> {
  /** The client of the queue: visibility changes, deletes (plain loops) and dead-letter sends go through it. Required. */
  sqs: SQSClient;
  /** The URL of the queue the messages come from. Required. */
  queueUrl: string;
  /** Where the key comes from. Default: the `Idempotency-Key` attribute, else `MessageDeduplicationId` within its group, else `MessageId`. */
  key?: SqsKeySource<Message>;
  /** Where a permanent failure goes; without it, the message is left to the queue's redrive policy. Default: none. */
  deadLetterQueueUrl?: string;
  /**
   * The visibility a receive gives a message (the queue's `VisibilityTimeout`, or sqs-consumer's `visibilityTimeout`
   * in seconds): each renewal of the lease sets the message's visibility to it again. Default: `'30s'`.
   */
  visibilityTimeout?: Duration;
  /**
   * sqs-consumer's `handleMessageTimeout`, if set. sqs-consumer stops waiting for the handler then, but does not stop
   * it: the lease and the visibility are still renewed while it runs, and the message is deleted by the wrapper
   * (sqs-consumer ignores a late answer). Default: none.
   */
  handleMessageTimeout?: Duration;
  /** Called after each message is settled (also for `group-stopped`). Exceptions are logged and ignored. */
  onSettled?: (event: SqsSettledEvent) => void;
}

// SQS's longest visibility timeout, in seconds.
const MAX_VISIBILITY_S = 43_200;
// A message carries at most this many message attributes; the dead-letter copy adds its reason only below it.
const MAX_MESSAGE_ATTRIBUTES = 10;
// ChangeMessageVisibilityBatch takes at most this many entries.
const MAX_BATCH_ENTRIES = 10;
/** The message attribute a dead-letter copy carries: why it was dead-lettered. */
export const DEAD_LETTER_REASON_ATTRIBUTE = 'oncely-dead-letter-reason';

const SQS_OPTIONS = [
  'sqs',
  'queueUrl',
  'key',
  'deadLetterQueueUrl',
  'visibilityTimeout',
  'handleMessageTimeout',
];

/** One message's decision, once settled. */
interface Settled {
  event: SqsSettledEvent;
  /** Acknowledged: deleted, to be deleted by sqs-consumer, or sent to the dead-letter queue and deleted. */
  done: boolean;
  /** To hand back to sqs-consumer for deleting (it deletes what the handler returns). */
  handBack: boolean;
  /** When not `done`: in how long the message comes back (its visibility), for the rest of its FIFO group. */
  delayMs: number;
}

type Mode = 'sqs-consumer' | 'processor';

type SqsSdk = typeof import('@aws-sdk/client-sqs');
let sdk: Promise<SqsSdk> | undefined;
/**
 * The SDK's command classes, loaded with the first send rather than with this module: whoever sends has passed an
 * SQSClient, so the SDK is there, while this package installed only for `@oncely/sqs/records` needs no SDK.
 */
const commands = (): Promise<SqsSdk> => (sdk ??= import('@aws-sdk/client-sqs'));

/** A FIFO group's run of calls made while earlier ones are still pending, and why it stopped, if it did. */
interface GroupRun {
  tail: Promise<unknown>;
  pending: number;
  /** The messages queued that have not started: their visibility is extended with the running one's. */
  waiting: Set<Message>;
  stoppedDelayMs?: number;
}

/** The engine the three wrappers share: one per wrapped handler. */
function sqsEngine(handler: (message: Message) => unknown, options: SqsConsumerOptions) {
  const given = (options ?? {}) as Partial<SqsConsumerOptions>;
  const { sqs, queueUrl, deadLetterQueueUrl } = given;
  if (sqs === null || typeof sqs !== 'object' || typeof (sqs as { send?: unknown }).send !== 'function') {
    throw new IdempotencyOptionsError(
      'sqs',
      'must be an SQSClient from @aws-sdk/client-sqs (new SQSClient({ ... })): visibility changes, deletes and dead-letter sends go through it.',
    );
  }
  if (typeof queueUrl !== 'string' || queueUrl.length === 0) {
    throw new IdempotencyOptionsError(
      'queueUrl',
      'must be the URL of the queue the messages come from (the QueueUrl you receive from).',
    );
  }
  if (
    deadLetterQueueUrl !== undefined &&
    (typeof deadLetterQueueUrl !== 'string' ||
      deadLetterQueueUrl.length === 0 ||
      deadLetterQueueUrl === queueUrl)
  ) {
    throw new IdempotencyOptionsError(
      'deadLetterQueueUrl',
      `must be the URL of another queue, or left out to leave dead letters to the queue's redrive policy; got ${JSON.stringify(deadLetterQueueUrl)}.`,
    );
  }
  const visibilityMs =
    given.visibilityTimeout === undefined
      ? 30_000
      : durationOption('visibilityTimeout', given.visibilityTimeout);
  if (visibilityMs < 1000 || visibilityMs > MAX_VISIBILITY_S * 1000) {
    throw new IdempotencyOptionsError(
      'visibilityTimeout',
      `must be between '1s' and '12h' (SQS's limits), the visibility a receive gives a message; got ${JSON.stringify(given.visibilityTimeout)}.`,
    );
  }
  const visibilityS = Math.ceil(visibilityMs / 1000);
  const handleMessageTimeoutMs =
    given.handleMessageTimeout === undefined
      ? undefined
      : durationOption('handleMessageTimeout', given.handleMessageTimeout);
  // The lease is renewed at a third of lockTimeout, and the visibility with it: a lease longer than the visibility
  // would let the message come back (counted as a receive) before its first renewal, and after a crash it would
  // still hold the key when the message comes back. Equal by default: a crashed consumer's key is free by then.
  const lockTimeoutMs =
    given.lockTimeout === undefined ? visibilityMs : durationOption('lockTimeout', given.lockTimeout);
  if (lockTimeoutMs > visibilityMs) {
    throw new IdempotencyOptionsError(
      'lockTimeout',
      `must not be longer than visibilityTimeout (${visibilityMs}ms): the lease and the visibility are renewed together, and after a crash the message comes back when its visibility ends, so the key must be free by then. Leave it out to use visibilityTimeout.`,
    );
  }
  let keyOfMessage: ReturnType<typeof sqsKeyOf<Message>>;
  try {
    keyOfMessage = sqsKeyOf<Message>(given.key);
  } catch (error) {
    throw new IdempotencyOptionsError('key', (error as Error).message);
  }
  // One view per message, for its key, its order and its fingerprint.
  type View = ReturnType<typeof viewOfSdkMessage>;
  const views = new WeakMap<Message, View>();
  const viewOf = (message: Message): View => {
    let view = views.get(message);
    if (view === undefined) {
      view = viewOfSdkMessage(message);
      views.set(message, view);
    }
    return view;
  };
  const runtime = consumerRuntime<Message>(
    handler,
    { ...options, lockTimeout: lockTimeoutMs } as ConsumerOptions<Message>,
    {
      name: '@oncely/sqs',
      options: SQS_OPTIONS,
      keyOf: (message) => keyOfMessage(viewOf(message), message),
      fingerprint: (message) => sqsFingerprint(viewOf(message)),
    },
  );
  const { log, policy } = runtime;
  const fifo = queueUrl.endsWith('.fifo');
  const deadLetterFifo = deadLetterQueueUrl?.endsWith('.fifo') === true;
  let warnedNoCount = false;

  /** Failed attempts so far, from `ApproximateReceiveCount` (every earlier receive ended without a delete). */
  const failuresBefore = (message: Message): number => {
    const count = Number(message.Attributes?.ApproximateReceiveCount);
    if (Number.isSafeInteger(count) && count >= 1) return count - 1;
    if (!warnedNoCount) {
      warnedNoCount = true;
      log.warn(
        { queueUrl },
        "oncely: SQS messages arrive without ApproximateReceiveCount, so failed attempts cannot be counted and maxAttempts never dead-letters: receive with MessageSystemAttributeNames: ['All'] (sqs-consumer: messageSystemAttributeNames: ['All']). Said once.",
      );
    }
    return 0;
  };

  /** The FIFO group of a message: on a FIFO queue without `MessageGroupId`, every message is in one group. */
  const groupOf = (message: Message): string | undefined =>
    fifo ? (message.Attributes?.MessageGroupId ?? '') : undefined;

  /**
   * What runs one after another: a FIFO group; on a standard queue, one key, so that a duplicate in the same receive
   * waits for the first and replays instead of coming back as in progress (an extra receive, counted as an attempt).
   */
  const orderOf = (message: Message): string | undefined => {
    if (fifo) return `g:${groupOf(message)}`;
    try {
      const key = keyOfMessage(viewOf(message), message);
      return key === undefined ? undefined : `k:${key}`;
    } catch {
      // No usable key: decided alone, and settled as such.
      return undefined;
    }
  };

  const changeVisibility = async (message: Message, seconds: number) => {
    const { ChangeMessageVisibilityCommand } = await commands();
    return sqs.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: queueUrl,
        ReceiptHandle: message.ReceiptHandle,
        VisibilityTimeout: seconds,
      }),
    );
  };

  /**
   * Sets the visibility of messages waiting behind a running one of their order to `visibilityTimeout` again, with
   * each heartbeat of the running one, so that none comes back (a receive counted as an attempt) while it waits.
   * Failures are logged: such a message may come back while it waits, and is then a duplicate or in progress.
   */
  const extendWaiting = (waiting: ReadonlySet<Message>): void => {
    const messages = [...waiting];
    for (let i = 0; i < messages.length; i += MAX_BATCH_ENTRIES) {
      const chunk = messages.slice(i, i + MAX_BATCH_ENTRIES);
      commands()
        .then(({ ChangeMessageVisibilityBatchCommand }) =>
          sqs.send(
            new ChangeMessageVisibilityBatchCommand({
              QueueUrl: queueUrl,
              Entries: chunk.map((message, j) => ({
                Id: String(j),
                ReceiptHandle: message.ReceiptHandle,
                VisibilityTimeout: visibilityS,
              })),
            }),
          ),
        )
        .then(
          (output) => {
            for (const failed of output?.Failed ?? []) {
              log.error(
                { code: failed.Code, reason: failed.Message, messageId: chunk[Number(failed.Id)]?.MessageId },
                'oncely: could not extend the visibility of a waiting message; it may come back while it waits',
              );
            }
          },
          (error: unknown) =>
            log.error(
              { err: error, messageIds: chunk.map((message) => message.MessageId) },
              'oncely: ChangeMessageVisibilityBatch failed; the waiting messages may come back while they wait',
            ),
        );
    }
  };

  const deleteMessage = async (message: Message) => {
    const { DeleteMessageCommand } = await commands();
    return sqs.send(new DeleteMessageCommand({ QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle }));
  };

  /** Sets the visibility so the message comes back after `delayMs`; a failure is logged (it comes back anyway). */
  const comeBackAfter = async (message: Message, delayMs: number, key: string | undefined) => {
    try {
      await changeVisibility(message, secondsOf(delayMs));
    } catch (error) {
      log.error(
        { err: error, key, messageId: message.MessageId },
        'oncely: ChangeMessageVisibility failed; the message comes back when its visibility ends',
      );
    }
  };

  /** Sends a copy to the dead-letter queue, then deletes the original: a crash between the two sends it twice. */
  const sendToDeadLetterQueue = async (message: Message, reason: string) => {
    const attributes: Record<string, MessageAttributeValue> = {};
    let count = 0;
    for (const [name, value] of Object.entries(message.MessageAttributes ?? {})) {
      if (value?.DataType === undefined) continue;
      attributes[name] = value;
      count++;
    }
    if (count < MAX_MESSAGE_ATTRIBUTES) {
      attributes[DEAD_LETTER_REASON_ATTRIBUTE] = { DataType: 'String', StringValue: reason };
    }
    const { SendMessageCommand } = await commands();
    await sqs.send(
      new SendMessageCommand({
        QueueUrl: deadLetterQueueUrl,
        MessageBody: message.Body ?? '',
        MessageAttributes: attributes,
        // A FIFO dead-letter queue drops a second copy (a crash between this send and the delete) for 5 minutes.
        ...(deadLetterFifo
          ? {
              MessageGroupId: message.Attributes?.MessageGroupId ?? 'oncely-dead-letter',
              MessageDeduplicationId: message.MessageId,
            }
          : {}),
      }),
    );
    await deleteMessage(message);
  };

  const settle = async (
    message: Message,
    key: string | undefined,
    settlement: ConsumerSettlement,
    mode: Mode,
    startedAt: number,
    before: number,
  ): Promise<Settled> => {
    const event: SqsSettledEvent = runtime.settledEvent(message, key, settlement, before);
    const result: Settled = { event, done: false, handBack: false, delayMs: 0 };
    switch (settlement.action) {
      case 'ack': {
        result.done = true;
        // sqs-consumer deletes what handleMessage returns, unless it stopped waiting (handleMessageTimeout).
        const timedOut =
          handleMessageTimeoutMs !== undefined && Date.now() - startedAt >= handleMessageTimeoutMs;
        if (mode === 'sqs-consumer' && !timedOut) {
          result.handBack = true;
          break;
        }
        try {
          await deleteMessage(message);
        } catch (error) {
          log.error(
            { err: error, key, messageId: message.MessageId },
            'oncely: DeleteMessage failed; the message comes back and is acknowledged as a duplicate',
          );
        }
        break;
      }
      case 'delay':
      case 'retry':
        if (settlement.action === 'retry') event.failures = settlement.failures;
        result.delayMs = settlement.delayMs;
        await comeBackAfter(message, settlement.delayMs, key);
        break;
      case 'dead-letter': {
        if (settlement.reason === 'retries-exhausted') event.failures = before + 1;
        if (deadLetterQueueUrl === undefined) {
          // Left to the redrive policy: visible again at once, so the next receive past maxReceiveCount moves it.
          log.warn(
            { key, reason: settlement.reason, err: settlement.error, messageId: message.MessageId },
            "oncely: message dead-lettered (left to the queue's redrive policy)",
          );
          await comeBackAfter(message, 0, key);
          break;
        }
        try {
          await sendToDeadLetterQueue(message, settlement.reason);
          result.done = true;
          log.warn(
            { key, reason: settlement.reason, err: settlement.error, messageId: message.MessageId },
            'oncely: message dead-lettered (sent to deadLetterQueueUrl)',
          );
        } catch (error) {
          // Not safely in the dead-letter queue: keep it, and try again when it comes back.
          const delayMs = policy.retryDelayMs(Math.max(event.failures, 1));
          log.error(
            { err: error, key, messageId: message.MessageId },
            'oncely: could not move the message to deadLetterQueueUrl; it comes back to be tried again',
          );
          await comeBackAfter(message, delayMs, key);
          result.delayMs = delayMs;
          result.event = { ...event, action: 'retry', reason: 'failed', delayMs, error };
        }
        break;
      }
    }
    runtime.report(result.event as ConsumerSettledEvent<Message>);
    return result;
  };

  /**
   * Decides one message (running the handler at most once per key) and settles it. Never rejects. `waiting`: the
   * messages queued behind it, whose visibility its heartbeat extends too.
   */
  const decideAndSettle = async (
    message: Message,
    mode: Mode,
    startedAt = Date.now(),
    waiting?: ReadonlySet<Message>,
  ): Promise<Settled> => {
    try {
      // One heartbeat: each renewal of the lease sets the message's visibility again, so neither lapses alone.
      const before = failuresBefore(message);
      const { key, settlement } = await runtime.decide(message, before, undefined, {
        onRenewed: () => {
          if (waiting !== undefined && waiting.size > 0) extendWaiting(waiting);
          return changeVisibility(message, visibilityS);
        },
      });
      return await settle(message, key, settlement, mode, startedAt, before);
    } catch (error) {
      // Only a malformed message or a broken client gets here; the message comes back when its visibility ends.
      log.error(
        { err: error, messageId: message?.MessageId },
        'oncely: could not settle an SQS message; it comes back when its visibility ends',
      );
      const event: SqsSettledEvent = {
        key: undefined,
        action: 'delay',
        reason: 'store-error',
        failures: 0,
        delayMs: visibilityMs,
        error,
        message,
      };
      return { event, done: false, handBack: false, delayMs: visibilityMs };
    }
  };

  /** A FIFO message behind one of its group that was not acknowledged: it comes back with that one, not run. */
  const skip = async (message: Message, delayMs: number): Promise<Settled> => {
    await comeBackAfter(message, delayMs, undefined);
    const event: SqsSettledEvent = {
      key: undefined,
      action: 'delay',
      reason: 'group-stopped',
      failures: failuresBefore(message),
      delayMs,
      message,
    };
    runtime.report(event as unknown as ConsumerSettledEvent<Message>);
    return { event, done: false, handBack: false, delayMs };
  };

  /** A batch in order: each FIFO group's (or key's) messages one after another, stopped at the first not acknowledged. */
  const settleBatch = async (messages: readonly Message[], mode: Mode): Promise<(Settled | undefined)[]> => {
    const settled: (Settled | undefined)[] = new Array(messages.length);
    const index = new Map<Message, number>();
    const orders = messages.map(orderOf);
    // Each order's messages not started yet: a running message's heartbeat extends their visibility.
    const waiting = new Map<string, Set<Message>>();
    for (let i = 0; i < messages.length; i++) {
      const message = messages[i] as Message;
      index.set(message, i);
      const order = orders[i];
      if (order === undefined) continue;
      const behind = waiting.get(order);
      if (behind === undefined) waiting.set(order, new Set([message]));
      else behind.add(message);
    }
    const stoppedAfter = new Map<string, number>();
    await inGroupOrder(
      messages,
      (message) => orders[index.get(message) as number],
      async (message) => {
        const i = index.get(message) as number;
        const order = orders[i];
        const behind = order === undefined ? undefined : waiting.get(order);
        behind?.delete(message);
        const outcome = await decideAndSettle(message, mode, Date.now(), behind);
        settled[i] = outcome;
        if (!outcome.done && order !== undefined) stoppedAfter.set(order, outcome.delayMs);
        return outcome.done;
      },
    );
    await Promise.all(
      messages.map(async (message, i) => {
        if (settled[i] !== undefined) return;
        settled[i] = await skip(message, stoppedAfter.get(orders[i] as string) ?? 0);
      }),
    );
    return settled;
  };

  // The FIFO groups (standard queue: keys) with calls still pending (one message each), for `inCallOrder`.
  const groups = new Map<string, GroupRun>();

  /**
   * One message, handed over alone (sqs-consumer's `handleMessage`, the processor). The calls for one FIFO group
   * (standard queue: one key) made while earlier ones are pending (a receive's messages, handed over together) run
   * one after another in the order made, and those queued behind a message not acknowledged are not run.
   */
  const inCallOrder = (message: Message, mode: Mode): Promise<Settled> => {
    const calledAt = Date.now();
    const group = orderOf(message);
    if (group === undefined) return decideAndSettle(message, mode, calledAt);
    let run = groups.get(group);
    if (run === undefined) {
      run = { tail: Promise.resolve(), pending: 0, waiting: new Set() };
      groups.set(group, run);
    }
    const current = run;
    current.pending++;
    current.waiting.add(message);
    const step = current.tail.then(async () => {
      current.waiting.delete(message);
      if (current.stoppedDelayMs !== undefined) return skip(message, current.stoppedDelayMs);
      const outcome = await decideAndSettle(message, mode, calledAt, current.waiting);
      if (!outcome.done) current.stoppedDelayMs = outcome.delayMs;
      return outcome;
    });
    current.tail = step;
    return step.finally(() => {
      if (--current.pending === 0 && groups.get(group) === current) groups.delete(group);
    });
  };

  return { inCallOrder, settleBatch };
}

/** Whole seconds for ChangeMessageVisibility, within SQS's limits. */
function secondsOf(delayMs: number): number {
  return Math.min(MAX_VISIBILITY_S, Math.max(0, Math.ceil(delayMs / 1000)));
}

/**
 * sqs-consumer's `handleMessage`, run at most once per key across every consumer sharing `store`: resolves to the
 * message when it is to be deleted (done now, or a duplicate of work done), else `undefined` after setting its
 * visibility (in progress elsewhere: `inProgressDelay`; failed: `retryDelay`), or after sending it to
 * `deadLetterQueueUrl` and deleting it. Never rejects. On a FIFO queue, the messages of one receive (which sqs-consumer hands over together)
 * run in order within each group, and a group stops at its first message not acknowledged.
 *
 * ```ts
 * Consumer.create({
 *   queueUrl, sqs, visibilityTimeout: 30,
 *   messageSystemAttributeNames: ['All'], messageAttributeNames: ['All'],
 *   handleMessage: idempotentHandleMessage(handler, { sqs, queueUrl, store, visibilityTimeout: '30s' }),
 * });
 * ```
 *
 * Leave sqs-consumer's `heartbeatInterval`, `alwaysAcknowledge` and `terminateVisibilityTimeout` unset: the lease
 * renewal extends the visibility, `alwaysAcknowledge` would delete the messages this leaves to come back, and
 * `terminateVisibilityTimeout` makes visible at once what sqs-consumer's own failures touch (with
 * `handleMessageBatch`, a failed DeleteMessageBatch: the whole receive, undoing the delays set here).
 */
export function idempotentHandleMessage(
  handler: (message: Message) => unknown,
  options: SqsConsumerOptions,
): (message: Message) => Promise<Message | undefined> {
  const { inCallOrder } = sqsEngine(handler, options);
  return async (message) => {
    const { handBack } = await inCallOrder(message, 'sqs-consumer');
    return handBack ? message : undefined;
  };
}

/**
 * sqs-consumer's `handleMessageBatch`: decides each message as `idempotentHandleMessage` does and resolves to the
 * messages to delete. On a FIFO queue, each message group runs in order and stops at its first message not
 * acknowledged: the later ones are not run and come back with it. Never rejects; leave sqs-consumer's
 * `terminateVisibilityTimeout` unset all the same: when its own DeleteMessageBatch fails, it sets the visibility of
 * the whole receive, undoing the delays set here.
 */
export function idempotentHandleMessageBatch(
  handler: (message: Message) => unknown,
  options: SqsConsumerOptions,
): (messages: Message[]) => Promise<Message[]> {
  const { settleBatch } = sqsEngine(handler, options);
  return async (messages) => {
    const settled = await settleBatch(messages, 'sqs-consumer');
    const toDelete: Message[] = [];
    messages.forEach((message, i) => {
      if (settled[i]?.handBack === true) toDelete.push(message);
    });
    return toDelete;
  };
}

/**
 * For a plain `ReceiveMessage` loop: decides a message (running the handler at most once per key across every
 * consumer sharing `store`) and settles it itself: deletes it when done or a duplicate, sets its visibility to come
 * back (in progress elsewhere, failed), or dead-letters it. Resolves to what it did; never rejects.
 *
 * On a FIFO queue, hand it a whole receive at once, in the order received (`Promise.all(Messages.map(process))`):
 * calls for one message group run one after another, and the calls queued behind a message not acknowledged are not
 * run (they come back with it, `group-stopped`).
 */
export function idempotentSqsProcessor(
  handler: (message: Message) => unknown,
  options: SqsConsumerOptions,
): (message: Message) => Promise<SqsSettledEvent> {
  const { inCallOrder } = sqsEngine(handler, options);
  return async (message) => (await inCallOrder(message, 'processor')).event;
}
