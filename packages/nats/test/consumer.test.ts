/**
 * @services nats
 */
import { randomUUID } from 'node:crypto';
import {
  AckPolicy,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  jetstream,
  jetstreamManager,
} from '@nats-io/jetstream';
import { connect, headers, type NatsConnection, nanos } from '@nats-io/transport-node';
import { IdempotencyOptionsError, type IdempotencyStore, MemoryStore, PermanentError } from '@oncely/core';
import { idempotentConsumer, type NatsConsumerOptions, type NatsSettledEvent } from '@oncely/nats';
import { resumingWork, sleep, waitUntil } from '@oncely/testing';

// Against the NATS server (JetStream) on this machine. One stream of this file's own, ONCELY_TEST_<run>, deleted
// (with its consumers) in afterAll; nothing else on the server is touched.
const url = process.env.NATS_URL ?? '127.0.0.1:4222';
const run = randomUUID().slice(0, 8);
const stream = `ONCELY_TEST_${run}`;
const DUPLICATE_WINDOW_MS = 300;

let nc: NatsConnection;
let jsm: JetStreamManager;
let js: JetStreamClient;
const stores: MemoryStore[] = [];
const stops: (() => Promise<void>)[] = [];

beforeAll(async () => {
  nc = await connect({ servers: url });
  jsm = await jetstreamManager(nc);
  js = jetstream(nc);
  await jsm.streams.add({
    name: stream,
    subjects: [`oncely-test.${run}.>`],
    duplicate_window: nanos(DUPLICATE_WINDOW_MS),
  });
});
afterAll(async () => {
  for (const stop of stops) await stop();
  await jsm.streams.delete(stream);
  await nc.close();
  for (const s of stores) await s.close();
});

function newStore(): MemoryStore {
  const store = new MemoryStore();
  stores.push(store);
  return store;
}

const subject = (label: string) => `oncely-test.${run}.${label}`;

interface Consumer {
  events: (NatsSettledEvent & { at: number })[];
  stop(): Promise<void>;
}

/** A durable pull consumer on `label`'s subject (created once), and one more client consuming from it. */
async function consume(
  label: string,
  handler: (msg: JsMsg) => unknown,
  options: NatsConsumerOptions,
  ackWaitMs = 5000,
): Promise<Consumer> {
  await jsm.consumers.add(stream, {
    durable_name: label,
    ack_policy: AckPolicy.Explicit,
    filter_subject: subject(label),
    ack_wait: nanos(ackWaitMs),
  });
  const consumer = await js.consumers.get(stream, label);
  const messages = await consumer.consume({ max_messages: 10 });
  const events: Consumer['events'] = [];
  const handle = idempotentConsumer(handler, {
    ...options,
    onSettled: (event) => void events.push({ ...event, at: Date.now() }),
  });
  const loop = (async () => {
    for await (const msg of messages) void handle(msg);
  })();
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await messages.close();
    await loop;
  };
  stops.push(stop);
  return { events, stop };
}

async function publish(label: string, body: string, options: { msgID?: string; key?: string } = {}) {
  const h = headers();
  if (options.key !== undefined) h.set('Idempotency-Key', options.key);
  return js.publish(subject(label), body, {
    headers: h,
    ...(options.msgID === undefined ? {} : { msgID: options.msgID }),
  });
}

const reasons = (events: NatsSettledEvent[]) => events.map((e) => `${e.action}:${e.reason}`);

async function pendingOf(label: string) {
  const info = await jsm.consumers.info(stream, label);
  return { pending: info.num_pending, ackPending: info.num_ack_pending };
}

test('Nats-Msg-Id: JetStream drops a duplicate inside its window; past it, this layer acks it without running', async () => {
  let runs = 0;
  const c = await consume('msg-id', () => void runs++, { store: newStore() });
  const first = await publish('msg-id', '{"order":1}', { msgID: 'order-1' });
  const inWindow = await publish('msg-id', '{"order":1}', { msgID: 'order-1' });
  expect([first.duplicate, inWindow.duplicate]).toEqual([false, true]);
  await waitUntil(() => c.events.length === 1, 'first');
  await sleep(DUPLICATE_WINDOW_MS + 100);
  const late = await publish('msg-id', '{"order":1}', { msgID: 'order-1' });
  expect(late.duplicate).toBe(false); // the stream stored it: a redelivery JetStream cannot catch
  await waitUntil(() => c.events.length === 2, 'late duplicate');
  expect(runs).toBe(1);
  expect(reasons(c.events)).toEqual(['ack:executed', 'ack:replayed']);
  expect(c.events.map((e) => e.key)).toEqual(['order-1', 'order-1']);
  await waitUntil(async () => (await pendingOf('msg-id')).ackPending === 0, 'acks processed');
});

test('in progress elsewhere: the duplicate is nak-ed with a delay (no hot loop) and acked once done', async () => {
  const store = newStore();
  let runs = 0;
  const slow = async () => {
    runs++;
    await sleep(700);
  };
  const options = { store, inProgressDelay: 200, key: { header: 'Idempotency-Key' } } as const;
  const a = await consume('in-progress', slow, options);
  const b = await consume('in-progress', slow, options);
  await publish('in-progress', 'same', { key: 'busy' });
  await publish('in-progress', 'same', { key: 'busy' });
  const all = () => [...a.events, ...b.events].sort((x, y) => x.at - y.at);
  await waitUntil(() => all().filter((e) => e.action === 'ack').length === 2, 'both acked');
  expect(runs).toBe(1);
  const events = all();
  const delays = events.filter((e) => e.action === 'delay');
  expect(delays.length).toBeGreaterThanOrEqual(1);
  expect(delays.length).toBeLessThanOrEqual(5);
  for (const d of delays) expect(d).toMatchObject({ reason: 'in-progress', delayMs: 200 });
  const duplicateEvents = events.filter((e) => e.reason !== 'executed');
  for (let i = 1; i < duplicateEvents.length; i++) {
    expect((duplicateEvents[i]?.at ?? 0) - (duplicateEvents[i - 1]?.at ?? 0)).toBeGreaterThanOrEqual(190);
  }
  expect(
    reasons(events)
      .filter((r) => r.startsWith('ack:'))
      .sort(),
  ).toEqual(['ack:executed', 'ack:replayed']);
  await waitUntil(async () => (await pendingOf('in-progress')).ackPending === 0, 'acks processed');
});

test('a failing handler is nak-ed with retryDelay up to maxAttempts, then terminated, never redelivered', async () => {
  const deadLetters: NatsSettledEvent[] = [];
  const calls: number[] = [];
  const c = await consume(
    'retry-limit',
    () => {
      calls.push(Date.now());
      throw new Error('downstream unavailable');
    },
    {
      store: newStore(),
      key: { header: 'Idempotency-Key' },
      maxAttempts: 3,
      retryDelay: 150,
      onDeadLetter: (_msg, event) => void deadLetters.push(event),
    },
    1000,
  );
  await publish('retry-limit', 'payload', { key: 'always-fails' });
  await waitUntil(() => deadLetters.length === 1, 'the dead letter');
  expect(calls).toHaveLength(3);
  for (let i = 1; i < calls.length; i++) {
    expect((calls[i] as number) - (calls[i - 1] as number)).toBeGreaterThanOrEqual(140);
  }
  expect(c.events.map((e) => [e.action, e.reason, e.failures])).toEqual([
    ['retry', 'failed', 1],
    ['retry', 'failed', 2],
    ['dead-letter', 'retries-exhausted', 3],
  ]);
  expect(deadLetters[0]?.message.string()).toBe('payload');
  expect(deadLetters[0]?.error).toMatchObject({ message: 'downstream unavailable' });
  // term() took: past ack_wait (1s), nothing came back and nothing is pending.
  await sleep(1500);
  expect(calls).toHaveLength(3);
  expect(await pendingOf('retry-limit')).toEqual({ pending: 0, ackPending: 0 });
});

test('a handler that fails once and then succeeds: acked, its work done once', async () => {
  let calls = 0;
  let effects = 0;
  const c = await consume(
    'flaky',
    () => {
      calls++;
      if (calls === 1) throw new Error('timeout');
      effects++;
    },
    { store: newStore(), key: { header: 'Idempotency-Key' }, retryDelay: 100 },
  );
  await publish('flaky', 'x', { key: 'flaky-1' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['retry:failed', 'ack:executed']);
  expect([calls, effects]).toEqual([2, 1]);
});

test('steps: the redelivery after a failure replays the recorded step a without running it, then runs step b', async () => {
  const { work, runs, seen } = resumingWork();
  const c = await consume('steps', work, {
    store: newStore(),
    key: { header: 'Idempotency-Key' },
    retryDelay: 100,
  });
  await publish('steps', 'x', { key: 'steps-1' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['retry:failed', 'ack:executed']);
  expect(runs).toEqual({ deliveries: 2, a: 1, b: 1 });
  // Both deliveries got step a's one result, and the same derived key.
  expect(seen.map((s) => s.a)).toEqual([{ n: 1 }, { n: 1 }]);
  expect(seen[1]?.keyFor).toBe(seen[0]?.keyFor);
});

test('a permanent error is terminated at once, and so is a later duplicate, without running again', async () => {
  let calls = 0;
  const deadLetters: string[] = [];
  const c = await consume(
    'permanent',
    () => {
      calls++;
      throw new PermanentError('invalid order');
    },
    {
      store: newStore(),
      key: { header: 'Idempotency-Key' },
      onDeadLetter: (_m, e) => void deadLetters.push(e.reason),
    },
  );
  await publish('permanent', 'bad', { key: 'bad-order' });
  await waitUntil(() => c.events.length === 1, 'first');
  await publish('permanent', 'bad', { key: 'bad-order' });
  await waitUntil(() => c.events.length === 2, 'second');
  expect(calls).toBe(1);
  expect(reasons(c.events)).toEqual(['dead-letter:permanent', 'dead-letter:permanent']);
  expect(deadLetters).toEqual(['permanent', 'permanent']);
  expect(c.events[1]?.error).toMatchObject({ replayed: true });
});

test('no key: terminated by default (after onDeadLetter), or processed unprotected with onMissingKey', async () => {
  let calls = 0;
  const deadLetters: string[] = [];
  const c = await consume('no-key', () => void calls++, {
    store: newStore(),
    onDeadLetter: (msg) => void deadLetters.push(msg.string()),
  });
  await publish('no-key', 'anonymous');
  await waitUntil(() => c.events.length === 1, 'settled');
  expect(calls).toBe(0);
  expect(reasons(c.events)).toEqual(['dead-letter:missing-key']);
  expect(deadLetters).toEqual(['anonymous']);

  const p = await consume('no-key-process', () => void calls++, {
    store: newStore(),
    onMissingKey: 'process',
  });
  await publish('no-key-process', 'anonymous');
  await publish('no-key-process', 'anonymous');
  await waitUntil(() => p.events.length === 2, 'both');
  expect(calls).toBe(2);
  expect(reasons(p.events)).toEqual(['ack:executed', 'ack:executed']);
});

test('the same key with different data is terminated as a mismatch; the record stays', async () => {
  const bodies: string[] = [];
  const c = await consume('mismatch', (msg) => void bodies.push(msg.string()), {
    store: newStore(),
    key: { header: 'Idempotency-Key' },
  });
  await publish('mismatch', '{"amount":10}', { key: 'm-1' });
  await waitUntil(() => c.events.length === 1, 'first');
  await publish('mismatch', '{"amount":99}', { key: 'm-1' });
  await waitUntil(() => c.events.length === 2, 'second');
  await publish('mismatch', '{"amount":10}', { key: 'm-1' });
  await waitUntil(() => c.events.length === 3, 'third');
  expect(bodies).toEqual(['{"amount":10}']);
  expect(reasons(c.events)).toEqual(['ack:executed', 'dead-letter:mismatch', 'ack:replayed']);
});

test('onDeadLetter that fails: the message is nak-ed instead of terminated, and comes back', async () => {
  let attempts = 0;
  const c = await consume(
    'dlq-down',
    () => {
      throw new PermanentError('bad');
    },
    {
      store: newStore(),
      key: { header: 'Idempotency-Key' },
      retryDelay: 100,
      onDeadLetter: () => {
        attempts++;
        if (attempts === 1) throw new Error('dead-letter stream unavailable');
      },
    },
  );
  await publish('dlq-down', 'x', { key: 'dlq-1' });
  await waitUntil(() => c.events.length === 2, 'retry then term');
  expect(reasons(c.events)).toEqual(['retry:permanent', 'dead-letter:permanent']);
  expect(attempts).toBe(2);
});

test('workingInterval keeps a handler slower than ack_wait from being redelivered meanwhile', async () => {
  let runs = 0;
  const c = await consume(
    'working',
    async () => {
      runs++;
      await sleep(1600);
    },
    { store: newStore(), key: { header: 'Idempotency-Key' }, workingInterval: 300 },
    1000,
  );
  await publish('working', 'x', { key: 'long-1' });
  await waitUntil(() => c.events.length === 1, 'done', 10_000);
  await sleep(300);
  expect(runs).toBe(1);
  expect(c.events.map((e) => [e.action, e.reason, e.message.info.deliveryCount])).toEqual([
    ['ack', 'executed', 1],
  ]);
});

test('the store is down: nak-ed with a delay, then processed once it is back', async () => {
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
  const c = await consume('store-down', () => void runs++, {
    store: flaky,
    key: { header: 'Idempotency-Key' },
    inProgressDelay: 100,
  });
  await publish('store-down', 'x', { key: 'outage-1' });
  await waitUntil(() => c.events.some((e) => e.action === 'ack'), 'ack');
  expect(reasons(c.events)).toEqual(['delay:store-error', 'delay:store-error', 'ack:executed']);
  expect(runs).toBe(1);
});

describe('options are checked at construction', () => {
  test.each([
    [{ key: 'seq' }, 'key'],
    [{ onMissingKey: 'ack' }, 'onMissingKey'],
    [{ fingerprint: 'data' }, 'fingerprint'],
    [{ maxAttempts: -1 }, 'maxAttempts'],
    [{ retryDelay: 'soon' }, 'retryDelay'],
    [{ workingInterval: 0 }, 'workingInterval'],
    [{ onDeadLetter: 'dlq' }, 'onDeadLetter'],
    [{ termWithReason: 'yes' }, 'termWithReason'],
    [{ lockTimeout: 'long' }, 'lockTimeout'],
    [{ ackWait: 1000 }, 'ackWait'],
  ])('%p is refused, naming %s', (options, name) => {
    let error: unknown;
    try {
      idempotentConsumer(() => {}, options as never);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(IdempotencyOptionsError);
    expect((error as IdempotencyOptionsError).option).toBe(name);
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
      key: { header: 'Idempotency-Key' },
      fingerprint: () => {
        throw new Error('no fingerprint here');
      },
    },
  ],
] as [string, NatsConsumerOptions][])(
  '%s: the message is terminated, never run nor acked as done, and logged',
  async (_label, options) => {
    const label = `throwing-${randomUUID().slice(0, 6)}`;
    const warnings: string[] = [];
    const log = (level: string) => (_obj: object, msg?: string) =>
      void (level === 'warn' && warnings.push(msg ?? ''));
    let runs = 0;
    const c = await consume(label, () => void runs++, {
      store: newStore(),
      logger: { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') },
      ...options,
    });
    await publish(label, 'x', { key: 'k-1' });
    await waitUntil(() => c.events.length === 1, 'settled');
    expect(reasons(c.events)).toEqual(['dead-letter:invalid-key']);
    expect(runs).toBe(0);
    expect(warnings.some((w) => /terminated/.test(w))).toBe(true);
    await sleep(300);
    expect(await pendingOf(label)).toEqual({ pending: 0, ackPending: 0 });
  },
);
