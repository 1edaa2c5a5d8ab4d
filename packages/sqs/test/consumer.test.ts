/**
 * @services redis sqs-server
 */
// The wrappers with the real @aws-sdk/client-sqs and sqs-consumer, on an SQS server (fauxqs, started by this file
// on a free port, or SQS_ENDPOINT), with a RedisStore shared by the competing consumers. Every queue is this
// file's own (unique names) and deleted in afterAll; every Redis key is under a prefix of this run.
import { randomUUID } from 'node:crypto';
import {
  GetQueueAttributesCommand,
  type Message,
  ReceiveMessageCommand,
  SendMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { IdempotencyStore } from '@oncely/core';
import { RedisStore } from '@oncely/redis';
import {
  DEAD_LETTER_REASON_ATTRIBUTE,
  idempotentHandleMessage,
  idempotentHandleMessageBatch,
  idempotentSqsProcessor,
  type SqsConsumerOptions,
  type SqsSettledEvent,
} from '@oncely/sqs';
import {
  createTestQueue,
  type SqsServer,
  sleep,
  startSqsServer,
  type TestQueue,
  waitUntil,
} from '@oncely/testing';
import Redis from 'ioredis';
import { Consumer, type ConsumerOptions } from 'sqs-consumer';

const run = randomUUID().slice(0, 8);
let server: SqsServer;
let sqs: SQSClient;
let redis: Redis;
const queues: TestQueue[] = [];
const consumers: Consumer[] = [];
let stores = 0;

beforeAll(async () => {
  server = await startSqsServer();
  sqs = server.client();
  redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { lazyConnect: true });
  await redis.connect();
}, 60_000);
afterEach(() => {
  for (const c of consumers.splice(0)) c.stop();
});
afterAll(async () => {
  for (const q of queues) await q.delete().catch(() => undefined);
  sqs?.destroy();
  await server?.stop();
  // Only this run's keys.
  const keys = await redis.keys(`oncely-test:sqs:${run}:*`);
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
});

function newStore(): IdempotencyStore {
  return new RedisStore({ client: redis, prefix: `oncely-test:sqs:${run}:${stores++}:` });
}

async function queue(options: Parameters<typeof createTestQueue>[1] = {}): Promise<TestQueue> {
  const q = await createTestQueue(sqs, { prefix: `oncely-sqs-${run}`, ...options });
  queues.push(q);
  return q;
}

async function send(url: string, body: string, key?: string, group?: string): Promise<string> {
  const { MessageId } = await sqs.send(
    new SendMessageCommand({
      QueueUrl: url,
      MessageBody: body,
      ...(key === undefined
        ? {}
        : { MessageAttributes: { 'Idempotency-Key': { DataType: 'String', StringValue: key } } }),
      ...(group === undefined ? {} : { MessageGroupId: group, MessageDeduplicationId: randomUUID() }),
    }),
  );
  return MessageId as string;
}

/** Messages in the queue, visible, in flight or delayed. */
async function left(url: string): Promise<number> {
  const { Attributes = {} } = await sqs.send(
    new GetQueueAttributesCommand({
      QueueUrl: url,
      AttributeNames: [
        'ApproximateNumberOfMessages',
        'ApproximateNumberOfMessagesNotVisible',
        'ApproximateNumberOfMessagesDelayed',
      ],
    }),
  );
  return (
    Number(Attributes.ApproximateNumberOfMessages) +
    Number(Attributes.ApproximateNumberOfMessagesNotVisible) +
    Number(Attributes.ApproximateNumberOfMessagesDelayed)
  );
}

async function receiveAll(url: string, waitS = 1): Promise<Message[]> {
  const { Messages = [] } = await sqs.send(
    new ReceiveMessageCommand({
      QueueUrl: url,
      MaxNumberOfMessages: 10,
      WaitTimeSeconds: waitS,
      MessageSystemAttributeNames: ['All'],
      MessageAttributeNames: ['All'],
    }),
  );
  return Messages;
}

/** An sqs-consumer with the settings the README gives: system and message attributes asked for, no heartbeat. */
function startConsumer(url: string, rest: Partial<ConsumerOptions>): Consumer {
  const consumer = Consumer.create({
    queueUrl: url,
    sqs,
    waitTimeSeconds: 1,
    messageSystemAttributeNames: ['All'],
    messageAttributeNames: ['All'],
    suppressFifoWarning: true,
    ...rest,
  } as ConsumerOptions);
  consumer.on('error', () => undefined);
  consumer.on('processing_error', () => undefined);
  consumer.on('timeout_error', () => undefined);
  consumer.start();
  consumers.push(consumer);
  return consumer;
}

function wrapperOptions(url: string, extra: Partial<SqsConsumerOptions> = {}): SqsConsumerOptions {
  return { sqs, queueUrl: url, store: newStore(), retryDelay: '1s', inProgressDelay: '1s', ...extra };
}

/** Work that takes `ms`, counting its runs and whether two of them ever overlapped. */
function slowWork(ms: number) {
  const state = {
    runs: 0,
    running: 0,
    overlapped: false,
    work: async () => {
      state.runs++;
      state.running++;
      if (state.running > 1) state.overlapped = true;
      await sleep(ms);
      state.running--;
    },
  };
  return state;
}

/**
 * Two sqs-consumers of `url` sharing one store, each with `idempotentHandleMessage(work)`, both given the queue's
 * visibility timeout (`visibilityS`); counts the receives and collects the settlements.
 */
function competingConsumers(
  url: string,
  work: (m: Message) => unknown,
  visibilityS: number,
  consumer: Partial<ConsumerOptions> = {},
  wrapper: Partial<SqsConsumerOptions> = {},
): { receives: number; events: SqsSettledEvent[] } {
  const store = newStore();
  const seen = { receives: 0, events: [] as SqsSettledEvent[] };
  const options = wrapperOptions(url, {
    store,
    visibilityTimeout: visibilityS * 1000,
    onSettled: (e) => seen.events.push(e),
    ...wrapper,
  });
  for (let i = 0; i < 2; i++) {
    const c = startConsumer(url, {
      visibilityTimeout: visibilityS,
      ...consumer,
      handleMessage: idempotentHandleMessage(work, options),
    });
    c.on('message_received', () => seen.receives++);
  }
  return seen;
}

test('handleMessage: executes once per key, duplicates under other MessageIds are deleted without running', async () => {
  const q = await queue();
  const runs = new Map<string, number>();
  const events: SqsSettledEvent[] = [];
  const handle = idempotentHandleMessage(
    (m) => {
      runs.set(m.Body as string, (runs.get(m.Body as string) ?? 0) + 1);
    },
    wrapperOptions(q.url, { onSettled: (e) => events.push(e) }),
  );
  const ids = [
    await send(q.url, 'order-1', 'k1'),
    await send(q.url, 'order-1', 'k1'),
    await send(q.url, 'order-2', 'k2'),
    await send(q.url, 'order-1', 'k1'),
  ];
  expect(new Set(ids).size).toBe(4);
  startConsumer(q.url, { handleMessage: handle, batchSize: 10 });
  await waitUntil(() => events.length === 4, 'four messages settled');
  await waitUntil(async () => (await left(q.url)) === 0, 'the queue empty');
  expect(Object.fromEntries(runs)).toEqual({ 'order-1': 1, 'order-2': 1 });
  expect(events.filter((e) => e.reason === 'executed')).toHaveLength(2);
  expect(events.filter((e) => e.action === 'ack')).toHaveLength(4);
});

test('in progress elsewhere: the duplicate comes back through its visibility and is deleted once the work is done', async () => {
  const q = await queue({ visibilityTimeout: 10 });
  const slow = slowWork(2500);
  const seen = competingConsumers(q.url, slow.work, 10);
  const { events } = seen;
  await send(q.url, 'pay', 'held');
  await sleep(300);
  await send(q.url, 'pay', 'held');
  await waitUntil(async () => (await left(q.url)) === 0, 'both copies deleted');
  expect(slow.runs).toBe(1);
  expect(events.some((e) => e.action === 'delay' && e.reason === 'in-progress' && e.delayMs === 1000)).toBe(
    true,
  );
  expect(
    events
      .filter((e) => e.action === 'ack')
      .map((e) => e.reason)
      .sort(),
  ).toEqual(['executed', 'replayed']);
  // The delayed copy came back after about inProgressDelay, not after the 10 s visibility.
  expect(seen.receives).toBeGreaterThanOrEqual(3);
});

test('a failure is retried through the visibility, then sent to deadLetterQueueUrl after maxAttempts', async () => {
  const q = await queue({ visibilityTimeout: 10 });
  const dead = await queue();
  let runs = 0;
  const events: SqsSettledEvent[] = [];
  startConsumer(q.url, {
    visibilityTimeout: 10,
    handleMessage: idempotentHandleMessage(
      () => {
        runs++;
        throw new Error('card declined');
      },
      wrapperOptions(q.url, {
        maxAttempts: 3,
        visibilityTimeout: '10s',
        deadLetterQueueUrl: dead.url,
        onSettled: (e) => events.push(e),
      }),
    ),
  });
  await send(q.url, 'charge', 'k-fails');
  let copies: Message[] = [];
  await waitUntil(async () => {
    copies = copies.concat(await receiveAll(dead.url, 0));
    return copies.length > 0;
  }, 'the dead-letter copy');
  // Reported once the original is deleted too, just after the copy is in the dead-letter queue.
  await waitUntil(() => events.length === 3, 'three settlements');
  expect(runs).toBe(3);
  expect(events.map((e) => `${e.action}:${e.failures}`)).toEqual(['retry:1', 'retry:2', 'dead-letter:3']);
  expect(copies[0]?.Body).toBe('charge');
  expect(copies[0]?.MessageAttributes?.[DEAD_LETTER_REASON_ATTRIBUTE]?.StringValue).toBe('retries-exhausted');
  expect(copies[0]?.MessageAttributes?.['Idempotency-Key']?.StringValue).toBe('k-fails');
  await waitUntil(async () => (await left(q.url)) === 0, 'the original deleted');
});

test("without deadLetterQueueUrl the queue's redrive policy moves the message after maxReceiveCount", async () => {
  const q = await queue({ visibilityTimeout: 10, deadLetter: { maxReceiveCount: 3 } });
  let runs = 0;
  startConsumer(q.url, {
    visibilityTimeout: 10,
    handleMessage: idempotentHandleMessage(
      () => {
        runs++;
        throw new Error('card declined');
      },
      wrapperOptions(q.url, { maxAttempts: 3, visibilityTimeout: '10s' }),
    ),
  });
  await send(q.url, 'charge', 'k-redrive');
  const deadUrl = q.deadLetter?.url as string;
  let copies: Message[] = [];
  await waitUntil(async () => {
    copies = copies.concat(await receiveAll(deadUrl, 0));
    return copies.length > 0;
  }, 'the message in the redrive dead-letter queue');
  expect(copies[0]?.Body).toBe('charge');
  expect(runs).toBe(3);
  expect(await left(q.url)).toBe(0);
});

test('the lease renewal extends the visibility: a handler slower than the visibility timeout runs once', async () => {
  const q = await queue({ visibilityTimeout: 2 });
  const slow = slowWork(5000);
  const seen = competingConsumers(q.url, slow.work, 2);
  const { events } = seen;
  await send(q.url, 'slow', 'k-slow');
  await waitUntil(
    async () => events.length >= 1 && (await left(q.url)) === 0,
    'the message done and deleted',
    30_000,
  );
  expect(slow.runs).toBe(1);
  expect(slow.overlapped).toBe(false);
  // Never visible again while it ran: no other receive, no in-progress delay.
  expect(seen.receives).toBe(1);
  expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual(['ack:executed']);
});

test("sqs-consumer's handleMessageTimeout: the handler it stops waiting for keeps the key and the message", async () => {
  const q = await queue({ visibilityTimeout: 2 });
  const slow = slowWork(4000);
  // sqs-consumer makes a timed-out message visible again at once.
  competingConsumers(
    q.url,
    slow.work,
    2,
    { handleMessageTimeout: 1000, terminateVisibilityTimeout: true },
    { handleMessageTimeout: 1000 },
  );
  await send(q.url, 'slow', 'k-timeout');
  await waitUntil(async () => (await left(q.url)) === 0, 'the message deleted', 30_000);
  expect(slow.runs).toBe(1);
  expect(slow.overlapped).toBe(false);
});

// fauxqs hands out one message of a group per receive, so here a batch holds one message per group: the group stop
// within a batch is in settlement.test.ts, the order across receives under a failure here.
test('handleMessageBatch on FIFO: a failed message holds its group back until it is done', async () => {
  const q = await queue({ fifo: true, visibilityTimeout: 10 });
  const order: string[] = [];
  let failedOnce = false;
  startConsumer(q.url, {
    visibilityTimeout: 10,
    batchSize: 10,
    handleMessageBatch: idempotentHandleMessageBatch(
      (m) => {
        order.push(m.Body as string);
        if (m.Body === 'a2' && !failedOnce) {
          failedOnce = true;
          throw new Error('a2 fails once');
        }
      },
      wrapperOptions(q.url, { visibilityTimeout: '10s' }),
    ),
  });
  for (const body of ['a1', 'a2', 'a3', 'a4']) await send(q.url, body, `fifo-${run}-${body}`, 'A');
  for (const body of ['b1', 'b2']) await send(q.url, body, `fifo-${run}-${body}`, 'B');
  await waitUntil(async () => (await left(q.url)) === 0, 'every message deleted');
  const a = order.filter((b) => b.startsWith('a'));
  expect(a).toEqual(['a1', 'a2', 'a2', 'a3', 'a4']);
  expect(order.filter((b) => b.startsWith('b'))).toEqual(['b1', 'b2']);
});

test('plain ReceiveMessage loop: the processor deletes, delays and keeps FIFO group order itself', async () => {
  const q = await queue({ fifo: true, visibilityTimeout: 10 });
  const order: string[] = [];
  let failedOnce = false;
  const events: SqsSettledEvent[] = [];
  const process = idempotentSqsProcessor(
    (m) => {
      order.push(m.Body as string);
      if (m.Body === 'a1' && !failedOnce) {
        failedOnce = true;
        throw new Error('a1 fails once');
      }
    },
    wrapperOptions(q.url, { visibilityTimeout: '10s', onSettled: (e) => events.push(e) }),
  );
  for (const body of ['a1', 'a2', 'a3']) await send(q.url, body, `loop-${run}-${body}`, 'A');
  // A duplicate of a2 under another MessageId (another deduplication id, the same Idempotency-Key).
  await send(q.url, 'a2', `loop-${run}-a2`, 'A');
  let stop = false;
  const loop = (async () => {
    while (!stop) {
      const messages = await receiveAll(q.url, 1);
      await Promise.all(messages.map(process));
    }
  })();
  try {
    await waitUntil(async () => (await left(q.url)) === 0, 'every message deleted');
  } finally {
    stop = true;
    await loop;
  }
  expect(order).toEqual(['a1', 'a1', 'a2', 'a3']);
  // fauxqs hands out one message of a group per receive (SQS may hand out several), so no call is skipped here
  // (settlement.test.ts covers that); the retry still holds the group back until a1 is done.
  expect(events.find((e) => e.reason === 'failed')?.message.Body).toBe('a1');
  expect(events.filter((e) => e.reason === 'replayed')).toHaveLength(1);
});

test('one key twice in a receive: the second waits invisible, replays and is deleted, never received again', async () => {
  const q = await queue({ visibilityTimeout: 1 });
  let runs = 0;
  const events: SqsSettledEvent[] = [];
  const process = idempotentSqsProcessor(
    async () => {
      runs++;
      await sleep(3500);
    },
    wrapperOptions(q.url, { visibilityTimeout: '1s', onSettled: (e) => events.push(e) }),
  );
  await send(q.url, 'twice', `wait-${run}`);
  await send(q.url, 'twice', `wait-${run}`);
  let messages: Message[] = [];
  await waitUntil(async () => {
    messages.push(...(await receiveAll(q.url, 1)));
    return messages.length >= 2;
  }, 'both messages received');
  messages = messages.slice(0, 2);
  const settling = Promise.all(messages.map(process));
  // While the first runs (longer than the visibility), neither message is handed out again.
  const again: Message[] = [];
  let done = false;
  void settling.finally(() => {
    done = true;
  });
  while (!done) {
    again.push(...(await receiveAll(q.url, 0)));
    await sleep(250);
  }
  await settling;
  expect(again.map((m) => m.MessageId)).toEqual([]);
  expect(runs).toBe(1);
  expect(events.map((e) => `${e.action}/${e.reason}`).sort()).toEqual(['ack/executed', 'ack/replayed']);
  await waitUntil(async () => (await left(q.url)) === 0, 'both deleted');
}, 30_000);
