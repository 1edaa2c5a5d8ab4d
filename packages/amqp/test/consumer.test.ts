/**
 * @services rabbitmq
 */
import { randomUUID } from 'node:crypto';
import {
  type AmqpConsumerOptions,
  type AmqpSettledEvent,
  delayQueueName,
  FAILURES_HEADER,
  idempotentConsumer,
  ORIGINAL_ROUTING_KEY_HEADER,
} from '@oncely/amqp';
import { IdempotencyOptionsError, type IdempotencyStore, MemoryStore, PermanentError } from '@oncely/core';
import { resumingWork, sleep, waitUntil } from '@oncely/testing';
import {
  type Channel,
  type ChannelModel,
  type ConfirmChannel,
  type ConsumeMessage,
  connect,
  type GetMessage,
} from 'amqplib';

// Against the RabbitMQ on this machine. Every queue and exchange is named oncely-test.<run>.*, and deleted in
// afterAll (delay queues included); nothing else on the broker is touched.
const url = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const run = randomUUID().slice(0, 8);

let connection: ChannelModel;
let admin: ConfirmChannel;
const queues = new Set<string>();
const exchanges = new Set<string>();
const stores: MemoryStore[] = [];

beforeAll(async () => {
  connection = await connect(url);
  admin = await connection.createConfirmChannel();
});
afterAll(async () => {
  for (const q of queues) await admin.deleteQueue(q);
  for (const e of exchanges) await admin.deleteExchange(e);
  await connection.close();
  for (const s of stores) await s.close();
});

/** A queue of this test's own whose dead-letter exchange feeds `dead`. */
async function freshQueue(label: string): Promise<{ queue: string; dead: string }> {
  const queue = `oncely-test.${run}.${label}`;
  const dlx = `${queue}.dlx`;
  const dead = `${queue}.dead`;
  exchanges.add(dlx);
  queues.add(queue).add(dead);
  await admin.assertExchange(dlx, 'fanout', { durable: false });
  await admin.assertQueue(dead, { durable: false });
  await admin.bindQueue(dead, dlx, '');
  await admin.assertQueue(queue, { durable: false, deadLetterExchange: dlx });
  return { queue, dead };
}

function newStore(): MemoryStore {
  const store = new MemoryStore();
  stores.push(store);
  return store;
}

interface Consumer {
  channel: ConfirmChannel;
  events: (AmqpSettledEvent & { at: number })[];
  stop(): Promise<void>;
}

async function consume(
  queue: string,
  handler: (msg: ConsumeMessage) => unknown,
  options: Omit<AmqpConsumerOptions, 'channel' | 'queue'>,
  prefetch = 10,
): Promise<Consumer> {
  const channel = await connection.createConfirmChannel();
  await channel.prefetch(prefetch);
  const events: Consumer['events'] = [];
  await channel.consume(
    queue,
    idempotentConsumer(handler, {
      ...options,
      channel,
      queue,
      onSettled: (event) => {
        events.push({ ...event, at: Date.now() });
        // Remember delay queues so afterAll can delete them.
        if (event.delayMs !== undefined) queues.add(delayQueueName(queue, event.delayMs));
      },
    }),
  );
  return { channel, events, stop: () => channel.close() };
}

async function publish(queue: string, body: string, options: Parameters<Channel['publish']>[3] = {}) {
  admin.sendToQueue(queue, Buffer.from(body), options);
  await admin.waitForConfirms();
}

/** Everything waiting in `queue` (ready messages), taken off it. */
async function drain(queue: string): Promise<GetMessage[]> {
  const out: GetMessage[] = [];
  for (;;) {
    const msg = await admin.get(queue, { noAck: true });
    if (msg === false) return out;
    out.push(msg);
  }
}

const reasons = (events: AmqpSettledEvent[]) => events.map((e) => `${e.action}:${e.reason}`);

test('a message runs once; a duplicate with the same messageId is acked without running', async () => {
  const { queue } = await freshQueue('dup');
  let runs = 0;
  const c = await consume(queue, () => void runs++, { store: newStore() });
  await publish(queue, '{"order":1}', { messageId: 'order-1' });
  await waitUntil(() => c.events.length === 1, 'first settlement');
  await publish(queue, '{"order":1}', { messageId: 'order-1' });
  await waitUntil(() => c.events.length === 2, 'second settlement');
  expect(runs).toBe(1);
  expect(reasons(c.events)).toEqual(['ack:executed', 'ack:replayed']);
  await c.stop(); // unacked messages would return to the queue now
  expect((await admin.checkQueue(queue)).messageCount).toBe(0);
});

test('in progress elsewhere: the duplicate waits in the delay queue (no hot loop) and is acked once done', async () => {
  const { queue } = await freshQueue('in-progress');
  const store = newStore();
  let runs = 0;
  const slow = async () => {
    runs++;
    await sleep(700);
  };
  const options = { store, inProgressDelay: 200 };
  const a = await consume(queue, slow, options, 1);
  const b = await consume(queue, slow, options, 1);
  await publish(queue, 'same body', { messageId: 'busy' });
  await publish(queue, 'same body', { messageId: 'busy' });
  const all = () => [...a.events, ...b.events].sort((x, y) => x.at - y.at);
  await waitUntil(() => all().filter((e) => e.action === 'ack').length === 2, 'both acked');
  expect(runs).toBe(1);
  const events = all();
  const delays = events.filter((e) => e.action === 'delay');
  // 700ms of work, 200ms per round trip through the delay queue: a handful of delays, never a hot loop.
  expect(delays.length).toBeGreaterThanOrEqual(1);
  expect(delays.length).toBeLessThanOrEqual(5);
  for (const d of delays) expect(d).toMatchObject({ reason: 'in-progress', delayMs: 200, failures: 0 });
  // Each delayed copy came back no sooner than the delay.
  const duplicateEvents = events.filter((e) => e !== events.find((x) => x.reason === 'executed'));
  for (let i = 1; i < duplicateEvents.length; i++) {
    expect((duplicateEvents[i]?.at ?? 0) - (duplicateEvents[i - 1]?.at ?? 0)).toBeGreaterThanOrEqual(190);
  }
  expect(
    reasons(events)
      .filter((r) => r.startsWith('ack:'))
      .sort(),
  ).toEqual(['ack:executed', 'ack:replayed']);
  // The copy that came back through the delay queue says where it was first routed.
  const replayed = events.find((e) => e.reason === 'replayed');
  expect(replayed?.message.properties.headers?.[ORIGINAL_ROUTING_KEY_HEADER]).toBe(queue);
  expect(replayed?.message.fields.redelivered).toBe(false); // a fresh copy, not a broker redelivery
  await a.stop();
  await b.stop();
  expect((await admin.checkQueue(queue)).messageCount).toBe(0);
});

test('a failing handler is retried after retryDelay up to maxAttempts, then dead-lettered', async () => {
  const { queue, dead } = await freshQueue('retry-limit');
  const store = newStore();
  const calls: number[] = [];
  const c = await consume(
    queue,
    () => {
      calls.push(Date.now());
      throw new Error('downstream unavailable');
    },
    { store, maxAttempts: 3, retryDelay: 150 },
  );
  await publish(queue, 'payload', { messageId: 'always-fails', persistent: true });
  await waitUntil(async () => (await admin.checkQueue(dead)).messageCount === 1, 'the dead-lettered message');
  expect(calls).toHaveLength(3);
  for (let i = 1; i < calls.length; i++) {
    expect((calls[i] as number) - (calls[i - 1] as number)).toBeGreaterThanOrEqual(140);
  }
  expect(c.events.map((e) => [e.action, e.reason, e.failures])).toEqual([
    ['retry', 'failed', 1],
    ['retry', 'failed', 2],
    ['dead-letter', 'retries-exhausted', 3],
  ]);
  const [deadMsg] = await drain(dead);
  expect(deadMsg?.content.toString()).toBe('payload');
  expect(deadMsg?.properties.messageId).toBe('always-fails');
  expect(deadMsg?.properties.deliveryMode).toBe(2); // persistence survived the re-publishing
  expect(deadMsg?.properties.headers?.[FAILURES_HEADER]).toBe(2);
  // Each failure released the key, so nothing blocks a later attempt.
  expect(await store.get('always-fails')).toBeUndefined();
  await c.stop();
  expect((await admin.checkQueue(queue)).messageCount).toBe(0);
});

test('a handler that fails once and then succeeds: acked, its work done once', async () => {
  const { queue, dead } = await freshQueue('flaky');
  let calls = 0;
  let effects = 0;
  const c = await consume(
    queue,
    () => {
      calls++;
      if (calls === 1) throw new Error('timeout');
      effects++;
    },
    { store: newStore(), retryDelay: 100 },
  );
  await publish(queue, 'x', { messageId: 'flaky-1' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['retry:failed', 'ack:executed']);
  expect([calls, effects]).toEqual([2, 1]);
  expect((await admin.checkQueue(dead)).messageCount).toBe(0);
  await c.stop();
});

test('steps: the redelivery after a failure replays the recorded step a without running it, then runs step b', async () => {
  const { queue, dead } = await freshQueue('steps');
  const { work, runs, seen } = resumingWork();
  const c = await consume(queue, work, { store: newStore(), retryDelay: 100 });
  await publish(queue, 'x', { messageId: 'steps-1' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['retry:failed', 'ack:executed']);
  expect(runs).toEqual({ deliveries: 2, a: 1, b: 1 });
  // Both deliveries got step a's one result, and the same derived key.
  expect(seen.map((s) => s.a)).toEqual([{ n: 1 }, { n: 1 }]);
  expect(seen[1]?.keyFor).toBe(seen[0]?.keyFor);
  expect((await admin.checkQueue(dead)).messageCount).toBe(0);
  await c.stop();
});

test('a permanent error is dead-lettered at once, and so is a later duplicate, without running again', async () => {
  const { queue, dead } = await freshQueue('permanent');
  let calls = 0;
  const c = await consume(
    queue,
    () => {
      calls++;
      throw new PermanentError('invalid order', { code: 'E_INVALID' });
    },
    { store: newStore() },
  );
  await publish(queue, 'bad', { messageId: 'bad-order' });
  await waitUntil(() => c.events.length === 1, 'first settlement');
  await publish(queue, 'bad', { messageId: 'bad-order' });
  await waitUntil(async () => (await admin.checkQueue(dead)).messageCount === 2, 'two dead letters');
  expect(calls).toBe(1);
  expect(reasons(c.events)).toEqual(['dead-letter:permanent', 'dead-letter:permanent']);
  expect(c.events[1]?.error).toMatchObject({ replayed: true });
  await drain(dead);
  await c.stop();
});

test('a message without a key is dead-lettered by default, or processed unprotected with onMissingKey', async () => {
  const { queue, dead } = await freshQueue('no-key');
  let calls = 0;
  const c = await consume(queue, () => void calls++, { store: newStore() });
  await publish(queue, 'anonymous');
  await waitUntil(async () => (await admin.checkQueue(dead)).messageCount === 1, 'dead letter');
  expect(calls).toBe(0);
  expect(reasons(c.events)).toEqual(['dead-letter:missing-key']);
  await c.stop();
  await drain(dead);

  const { queue: q2 } = await freshQueue('no-key-process');
  const p = await consume(q2, () => void calls++, { store: newStore(), onMissingKey: 'process' });
  await publish(q2, 'anonymous');
  await publish(q2, 'anonymous');
  await waitUntil(() => p.events.length === 2, 'both settled');
  expect(calls).toBe(2); // no key, no protection: both ran
  expect(reasons(p.events)).toEqual(['ack:executed', 'ack:executed']);
  await p.stop();
});

test('the same key with a different body is dead-lettered as a mismatch; the record stays', async () => {
  const { queue, dead } = await freshQueue('mismatch');
  const store = newStore();
  const bodies: string[] = [];
  const c = await consume(queue, (msg) => void bodies.push(msg.content.toString()), { store });
  await publish(queue, '{"amount":10}', { messageId: 'm-1' });
  await waitUntil(() => c.events.length === 1, 'first');
  await publish(queue, '{"amount":99}', { messageId: 'm-1' });
  await waitUntil(() => c.events.length === 2, 'second');
  await publish(queue, '{"amount":10}', { messageId: 'm-1' });
  await waitUntil(() => c.events.length === 3, 'third');
  expect(bodies).toEqual(['{"amount":10}']);
  expect(reasons(c.events)).toEqual(['ack:executed', 'dead-letter:mismatch', 'ack:replayed']);
  const dl = await drain(dead);
  expect(dl.map((m) => m.content.toString())).toEqual(['{"amount":99}']);
  await c.stop();
});

test('key from a header or from a function', async () => {
  const { queue } = await freshQueue('key-sources');
  const store = newStore();
  let headerRuns = 0;
  const h = await consume(queue, () => void headerRuns++, { store, key: { header: 'Idempotency-Key' } });
  // Header names are matched exactly first, then case-insensitively.
  await publish(queue, 'a', { headers: { 'idempotency-key': 'hk-1' }, messageId: 'first' });
  await publish(queue, 'a', { headers: { 'Idempotency-Key': 'hk-1' }, messageId: 'second' });
  await waitUntil(() => h.events.length === 2, 'header-keyed');
  expect(headerRuns).toBe(1);
  expect(h.events.map((e) => e.key)).toEqual(['hk-1', 'hk-1']);
  await h.stop();

  let fnRuns = 0;
  const f = await consume(queue, () => void fnRuns++, {
    store,
    key: (msg) => `order:${(JSON.parse(msg.content.toString()) as { id: string }).id}`,
    fingerprint: false,
  });
  // The second is published after the first is settled: sent together, it could meet the first in progress.
  await publish(queue, '{"id":"o-7","retry":0}');
  await waitUntil(() => f.events.length === 1, 'function-keyed first');
  await publish(queue, '{"id":"o-7","retry":1}');
  await waitUntil(() => f.events.length === 2, 'function-keyed');
  expect(fnRuns).toBe(1);
  expect(f.events.map((e) => `${e.key} ${e.reason}`)).toEqual(['order:o-7 executed', 'order:o-7 replayed']);
  await f.stop();
});

test('the store is down: the message is delayed without counting a failure, and runs once it is back', async () => {
  const { queue } = await freshQueue('store-down');
  const memory = newStore();
  let outages = 2;
  const flaky: IdempotencyStore = {
    acquire: async (k, o) => {
      if (outages > 0) {
        outages--;
        throw new Error('ECONNREFUSED');
      }
      return memory.acquire(k, o);
    },
    complete: (k, t, r, ttl) => memory.complete(k, t, r, ttl),
    release: (k, t) => memory.release(k, t),
    renew: (k, t, l) => memory.renew(k, t, l),
  };
  let runs = 0;
  const c = await consume(queue, () => void runs++, { store: flaky, inProgressDelay: 100, maxAttempts: 1 });
  await publish(queue, 'x', { messageId: 'during-outage' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['delay:store-error', 'delay:store-error', 'ack:executed']);
  expect(c.events.map((e) => e.failures)).toEqual([0, 0, 0]); // maxAttempts: 1 would have dead-lettered a failure
  expect(runs).toBe(1);
  await c.stop();
});

describe('options are checked at construction', () => {
  test('a channel that is not a confirm channel is refused', async () => {
    const plain = await connection.createChannel();
    expect(() => idempotentConsumer(() => {}, { channel: plain as ConfirmChannel, queue: 'q' })).toThrow(
      /option "channel" must be an amqplib confirm channel/,
    );
    await plain.close();
  });

  test.each([
    [{ key: 'deliveryTag' }, 'key'],
    [{ onMissingKey: 'ack' }, 'onMissingKey'],
    [{ fingerprint: 'body' }, 'fingerprint'],
    [{ maxAttempts: 0 }, 'maxAttempts'],
    [{ retryDelay: 'soon' }, 'retryDelay'],
    [{ inProgressDelay: -1 }, 'inProgressDelay'],
    [{ delayQueueArguments: [] }, 'delayQueueArguments'],
    [{ ttl: 'forever' }, 'ttl'],
    [{ onSettled: 'log' }, 'onSettled'],
    [{ prefetch: 10 }, 'prefetch'],
  ])('%p is refused, naming %s', (options, name) => {
    let error: unknown;
    try {
      idempotentConsumer(() => {}, { channel: admin, queue: 'q', ...(options as object) } as never);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(IdempotencyOptionsError);
    expect((error as IdempotencyOptionsError).option).toBe(name);
  });

  test('an empty queue name is refused', () => {
    expect(() => idempotentConsumer(() => {}, { channel: admin, queue: '' })).toThrow(/option "queue"/);
  });

  test('a missing channel or queue is refused, naming it', () => {
    expect(() => idempotentConsumer(() => {}, { queue: 'q' } as never)).toThrow(/option "channel"/);
    expect(() => idempotentConsumer(() => {}, { channel: admin } as never)).toThrow(/option "queue"/);
    expect(() => idempotentConsumer(() => {}, undefined as never)).toThrow(IdempotencyOptionsError);
  });
});

test.each([
  [
    'a key function that throws',
    {
      key: () => {
        throw new Error('no key here');
      },
    },
  ],
  [
    'a fingerprint function that throws',
    {
      fingerprint: () => {
        throw new Error('no fingerprint here');
      },
    },
  ],
])('%s: the message is dead-lettered, never run nor acked as done, and logged', async (_label, options) => {
  const { queue, dead } = await freshQueue(`throwing-${randomUUID().slice(0, 6)}`);
  const warnings: string[] = [];
  const log = (level: string) => (_obj: object, msg?: string) =>
    void (level === 'warn' && warnings.push(msg ?? ''));
  let runs = 0;
  const c = await consume(queue, () => void runs++, {
    store: newStore(),
    logger: { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') },
    ...options,
  });
  await publish(queue, 'x', { messageId: 'm-1' });
  await waitUntil(() => c.events.length === 1, 'settled');
  expect(reasons(c.events)).toEqual(['dead-letter:invalid-key']);
  expect(runs).toBe(0);
  expect(warnings.some((w) => /dead-lettered/.test(w))).toBe(true);
  await waitUntil(async () => (await admin.checkQueue(dead)).messageCount === 1, 'in the dead-letter queue');
  await c.stop();
  expect((await admin.checkQueue(queue)).messageCount).toBe(0);
});

test('hooks that throw change nothing: the message runs once and is acked', async () => {
  const { queue } = await freshQueue('throwing-hooks');
  const boom = () => {
    throw new Error('metrics down');
  };
  let runs = 0;
  const c = await consume(queue, () => void runs++, {
    store: newStore(),
    hooks: { onDecision: boom, onExecutionStart: boom, onExecutionEnd: boom, onComplete: boom },
  });
  await publish(queue, 'x', { messageId: 'h-1' });
  await waitUntil(() => c.events.length === 1, 'settled');
  expect(reasons(c.events)).toEqual(['ack:executed']);
  expect(runs).toBe(1);
  await c.stop();
  expect((await admin.checkQueue(queue)).messageCount).toBe(0);
});
