/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import {
  type BullmqProcessorOptions,
  type BullmqSettledEvent,
  idempotentProcessor,
  jobHash,
} from '@oncely/bullmq';
import { IdempotencyOptionsError, idempotent, MemoryStore, PermanentError } from '@oncely/core';
import { brokenStore, resumingWork, waitUntil } from '@oncely/testing';
import { DelayedError, type Job, type JobsOptions, Queue, UnrecoverableError, Worker } from 'bullmq';
import Redis from 'ioredis';

// Against the Redis on this machine. Every BullMQ key lives under the prefix oncely-bullmq-test-<run> (one queue per
// test), obliterated and then deleted in afterAll; nothing else in Redis is touched.
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const prefix = `oncely-bullmq-test-${run}`;

interface Order {
  orderId: string;
  amount?: number;
}
type OrderJob = Job<Order, unknown>;

let redis: Redis;
const queues: Queue[] = [];
const workers: Worker[] = [];
const stores: MemoryStore[] = [];

beforeAll(() => {
  redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
});
afterAll(async () => {
  await Promise.all(workers.map((w) => w.close(true)));
  for (const q of queues) {
    await q.obliterate({ force: true });
    await q.close();
  }
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  await redis.quit();
  for (const s of stores) await s.close();
});

function newStore(): MemoryStore {
  const store = new MemoryStore();
  stores.push(store);
  return store;
}

interface Harness {
  queue: Queue<Order>;
  events: BullmqSettledEvent<OrderJob>[];
  add(order: Order, opts?: JobsOptions): Promise<string>;
  /** The job once it is completed or failed. */
  settled(id: string): Promise<Job<Order>>;
  state(id: string): Promise<string>;
}

async function harness(
  label: string,
  fn: (job: OrderJob, token?: string) => unknown,
  options: Omit<BullmqProcessorOptions<OrderJob>, 'key'> &
    Partial<Pick<BullmqProcessorOptions<OrderJob>, 'key'>>,
  workerCount = 1,
): Promise<Harness> {
  const name = `${label}-${randomUUID().slice(0, 6)}`;
  const queue = new Queue<Order>(name, { connection: redis, prefix });
  queues.push(queue);
  const events: BullmqSettledEvent<OrderJob>[] = [];
  const processor = idempotentProcessor(fn, {
    key: (job) => job.data.orderId,
    ...options,
    onSettled: (event) => void events.push(event),
  });
  for (let i = 0; i < workerCount; i++) {
    workers.push(new Worker<Order>(name, processor, { connection: redis, prefix, concurrency: 5 }));
  }
  const get = async (id: string) => {
    const job = await queue.getJob(id);
    if (job === undefined) throw new Error(`job ${id} is gone`);
    return job;
  };
  return {
    queue,
    events,
    add: async (order, opts) => (await queue.add('charge', order, opts)).id as string,
    settled: async (id) => {
      await waitUntil(async () => ['completed', 'failed'].includes(await queue.getJobState(id)), `job ${id}`);
      return get(id);
    },
    state: (id) => queue.getJobState(id),
  };
}

const reasons = (events: BullmqSettledEvent<OrderJob>[]) => events.map((e) => `${e.action}:${e.reason}`);

test('a duplicate job (same key, another job id) completes with the first return value; fn runs once', async () => {
  let runs = 0;
  const h = await harness(
    'dup',
    (job) => {
      runs++;
      return { chargeId: `ch_${runs}`, amount: job.data.amount, at: new Date(0) };
    },
    { store: newStore() },
  );
  const first = await h.settled(await h.add({ orderId: 'o-1', amount: 10 }));
  const second = await h.settled(await h.add({ orderId: 'o-1', amount: 10 }));
  expect(first.id).not.toBe(second.id);
  expect(await h.state(first.id as string)).toBe('completed');
  expect(await h.state(second.id as string)).toBe('completed');
  expect(runs).toBe(1);
  expect(first.returnvalue).toEqual({ chargeId: 'ch_1', amount: 10, at: '1970-01-01T00:00:00.000Z' });
  expect(second.returnvalue).toEqual(first.returnvalue);
  expect(reasons(h.events)).toEqual(['ack:executed', 'ack:replayed']);
  expect(h.events.map((e) => e.key)).toEqual(['o-1', 'o-1']);
});

test('the processor resolves to the JSON form of the result on the first job as on its duplicates', async () => {
  const processor = idempotentProcessor(
    async (job: OrderJob) => ({ id: job.data.orderId, at: new Date(0) }),
    {
      store: newStore(),
      key: (job) => job.data.orderId,
    },
  );
  const job = (id: string) =>
    ({ id, name: 'charge', data: { orderId: 'json-form' }, attemptsMade: 0 }) as OrderJob;
  const first = await processor(job('1'), 'token');
  const duplicate = await processor(job('2'), 'token');
  expect(first).toStrictEqual({ id: 'json-form', at: '1970-01-01T00:00:00.000Z' });
  expect(duplicate).toStrictEqual(first);
});

test('a processor that returns nothing completes with null, and so do its duplicates', async () => {
  let runs = 0;
  const h = await harness('void', () => void runs++, { store: newStore() });
  const first = await h.settled(await h.add({ orderId: 'v-1' }));
  const second = await h.settled(await h.add({ orderId: 'v-1' }));
  expect(runs).toBe(1);
  expect([first.returnvalue, second.returnvalue]).toEqual([null, null]);
  expect(reasons(h.events)).toEqual(['ack:executed', 'ack:replayed']); // not "unstorable"
});

test('a return value JSON cannot carry: the job completes with null, is recorded as done, and is not run again', async () => {
  let runs = 0;
  const h = await harness('unstorable', () => ({ total: BigInt(++runs) }), { store: newStore() });
  const first = await h.settled(await h.add({ orderId: 'big' }));
  const second = await h.settled(await h.add({ orderId: 'big' }));
  expect([await h.state(first.id as string), await h.state(second.id as string)]).toEqual([
    'completed',
    'completed',
  ]);
  expect([first.returnvalue, second.returnvalue, runs]).toEqual([null, null, 1]);
  expect(reasons(h.events)).toEqual(['ack:unstorable', 'ack:unstorable']);
});

test('in progress elsewhere: the duplicate goes back to delayed (no attempt counted), then completes as a replay', async () => {
  let runs = 0;
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const h = await harness(
    'in-progress',
    async () => {
      runs++;
      await gate;
      return { done: runs };
    },
    { store: newStore(), inProgressDelay: 150 },
    2, // two competing workers
  );
  const a = await h.add({ orderId: 'busy' });
  await waitUntil(() => runs === 1, 'the first job to start');
  const b = await h.add({ orderId: 'busy' });
  await waitUntil(async () => (await h.state(b)) === 'delayed', 'the duplicate to be delayed');
  const delayed = await h.queue.getJob(b);
  expect(delayed?.attemptsMade).toBe(0);
  // It keeps coming back and going to delayed while the first runs, never failing.
  await waitUntil(() => h.events.filter((e) => e.action === 'delay').length >= 2, 'a second delay');
  expect(await h.state(b)).not.toBe('failed');
  release();
  const [ja, jb] = [await h.settled(a), await h.settled(b)];
  expect([await h.state(a), await h.state(b)]).toEqual(['completed', 'completed']);
  expect(runs).toBe(1);
  expect(jb.returnvalue).toEqual({ done: 1 });
  expect(ja.returnvalue).toEqual({ done: 1 });
  // BullMQ counts the completing attempt too: 1 means the delays (at least two, above) counted none.
  expect(jb.attemptsMade).toBe(1);
  const delays = h.events.filter((e) => e.action === 'delay');
  for (const d of delays) expect(d).toMatchObject({ reason: 'in-progress', delayMs: 150, failures: 0 });
  expect(reasons(h.events).filter((r) => r.startsWith('ack:'))).toEqual(['ack:executed', 'ack:replayed']);
});

test("a failure follows the job's own attempts and backoff, then the job fails; the key stays free", async () => {
  const calls: number[] = [];
  const store = newStore();
  const h = await harness(
    'retry',
    () => {
      calls.push(Date.now());
      throw new Error('downstream unavailable');
    },
    { store },
  );
  const id = await h.add(
    { orderId: 'always-fails' },
    { attempts: 3, backoff: { type: 'fixed', delay: 150 } },
  );
  const job = await h.settled(id);
  expect(await h.state(id)).toBe('failed');
  expect(job.attemptsMade).toBe(3);
  expect(job.failedReason).toBe('downstream unavailable');
  expect(calls).toHaveLength(3);
  for (let i = 1; i < calls.length; i++) {
    expect((calls[i] as number) - (calls[i - 1] as number)).toBeGreaterThanOrEqual(140);
  }
  expect(h.events.map((e) => [e.action, e.reason, e.failures])).toEqual([
    ['retry', 'failed', 1],
    ['retry', 'failed', 2],
    ['dead-letter', 'retries-exhausted', 3],
  ]);
  expect(h.events[0]?.delayMs).toBeUndefined(); // the job's backoff sets the delay, not oncely
  expect(await store.get('always-fails')).toBeUndefined();
});

test('a processor that fails once and then succeeds: completed, its work done once', async () => {
  let calls = 0;
  let effects = 0;
  const h = await harness(
    'flaky',
    () => {
      calls++;
      if (calls === 1) throw new Error('timeout');
      effects++;
      return 'ok';
    },
    { store: newStore() },
  );
  const job = await h.settled(await h.add({ orderId: 'flaky' }, { attempts: 3, backoff: 50 }));
  expect([job.returnvalue, job.attemptsMade, calls, effects]).toEqual(['ok', 2, 2, 1]); // attemptsMade counts the completing one
  expect(reasons(h.events)).toEqual(['retry:failed', 'ack:executed']);
});

test('steps: the retry after a failure replays the recorded step a without running it, then runs step b', async () => {
  const { work, runs, seen } = resumingWork();
  const h = await harness('steps', work, { store: newStore() });
  const job = await h.settled(await h.add({ orderId: 'steps' }, { attempts: 3, backoff: 50 }));
  expect([job.returnvalue, job.attemptsMade]).toEqual([{ a: { n: 1 } }, 2]);
  expect(reasons(h.events)).toEqual(['retry:failed', 'ack:executed']);
  expect(runs).toEqual({ deliveries: 2, a: 1, b: 1 });
  // Both attempts got step a's one result, and the same derived key.
  expect(seen.map((s) => s.a)).toEqual([{ n: 1 }, { n: 1 }]);
  expect(seen[1]?.keyFor).toBe(seen[0]?.keyFor);
});

test('a permanent error fails the job without retries, and a duplicate fails too without running', async () => {
  let calls = 0;
  const h = await harness(
    'permanent',
    () => {
      calls++;
      throw new PermanentError('invalid order', { code: 'E_INVALID' });
    },
    { store: newStore() },
  );
  const first = await h.settled(await h.add({ orderId: 'bad' }, { attempts: 5 }));
  const second = await h.settled(await h.add({ orderId: 'bad' }, { attempts: 5 }));
  expect([await h.state(first.id as string), await h.state(second.id as string)]).toEqual([
    'failed',
    'failed',
  ]);
  expect(calls).toBe(1);
  expect(first.attemptsMade).toBe(1);
  expect(second.attemptsMade).toBe(1);
  expect(first.failedReason).toBe('invalid order');
  expect(second.failedReason).toBe('invalid order');
  expect(reasons(h.events)).toEqual(['dead-letter:permanent', 'dead-letter:permanent']);
  expect(h.events[1]?.error).toMatchObject({ replayed: true, code: 'E_INVALID' });
});

test('isPermanent marks your own errors as permanent', async () => {
  class ValidationError extends Error {}
  let calls = 0;
  const h = await harness(
    'is-permanent',
    () => {
      calls++;
      throw new ValidationError('no such customer');
    },
    { store: newStore(), isPermanent: (e) => e instanceof ValidationError },
  );
  const job = await h.settled(await h.add({ orderId: 'v' }, { attempts: 4 }));
  expect([await h.state(job.id as string), job.attemptsMade, calls]).toEqual(['failed', 1, 1]);
});

test('a job without a key fails without running by default; onMissingKey: process runs it unprotected', async () => {
  let calls = 0;
  const h = await harness('no-key', () => ++calls, {
    store: newStore(),
    key: (job) => job.data.orderId || undefined,
  });
  const job = await h.settled(await h.add({ orderId: '' }, { attempts: 3 }));
  expect(await h.state(job.id as string)).toBe('failed');
  expect(job.attemptsMade).toBe(1);
  expect(job.failedReason).toMatch(/no idempotency key/);
  expect(calls).toBe(0);
  expect(reasons(h.events)).toEqual(['dead-letter:missing-key']);

  const p = await harness('no-key-process', () => ++calls, {
    store: newStore(),
    key: () => undefined,
    onMissingKey: 'process',
  });
  const a = await p.settled(await p.add({ orderId: 'x' }));
  const b = await p.settled(await p.add({ orderId: 'x' }));
  expect(calls).toBe(2); // no key, no protection: both ran
  expect([a.returnvalue, b.returnvalue].sort()).toEqual([1, 2]);
});

test('a key function that throws or returns a non-string fails the job as invalid-key, without running', async () => {
  let calls = 0;
  const h = await harness('bad-key', () => ++calls, {
    store: newStore(),
    key: (job) => {
      if (job.data.orderId === 'throw') throw new Error('no order id');
      return { not: 'a string' } as unknown as string;
    },
  });
  const a = await h.settled(await h.add({ orderId: 'throw' }, { attempts: 3 }));
  const b = await h.settled(await h.add({ orderId: 'object' }, { attempts: 3 }));
  expect([await h.state(a.id as string), await h.state(b.id as string)]).toEqual(['failed', 'failed']);
  expect([a.attemptsMade, b.attemptsMade, calls]).toEqual([1, 1, 0]);
  expect(a.failedReason).toMatch(/key function threw/);
  expect(reasons(h.events)).toEqual(['dead-letter:invalid-key', 'dead-letter:invalid-key']);
});

test('the same key with different data fails as a mismatch (the record stays); fingerprint: false replays', async () => {
  const runs: number[] = [];
  const store = newStore();
  const h = await harness('mismatch', (job) => runs.push(job.data.amount ?? 0), { store });
  const first = await h.settled(await h.add({ orderId: 'm-1', amount: 10 }));
  const second = await h.settled(await h.add({ orderId: 'm-1', amount: 99 }, { attempts: 3 }));
  const third = await h.settled(await h.add({ amount: 10, orderId: 'm-1' })); // key order does not matter
  expect([first, second, third].map((j) => j.finishedOn !== undefined && j.failedReason)).toEqual([
    undefined,
    expect.stringMatching(/different fingerprint/),
    undefined,
  ]);
  expect(second.attemptsMade).toBe(1);
  expect(third.returnvalue).toBe(1);
  expect(runs).toEqual([10]);
  expect(reasons(h.events)).toEqual(['ack:executed', 'dead-letter:mismatch', 'ack:replayed']);

  const loose = await harness('mismatch-off', (job) => runs.push(job.data.amount ?? 0), {
    store,
    fingerprint: false,
  });
  const other = await loose.settled(await loose.add({ orderId: 'm-1', amount: 55 }));
  expect(await loose.state(other.id as string)).toBe('completed');
  expect(other.returnvalue).toBe(1);
  expect(runs).toEqual([10]);
});

test('the default fingerprint covers the job name and its data, not the key order', () => {
  const job = (name: string, data: unknown) =>
    ({ name, data, attemptsMade: 0, moveToDelayed: async () => {} }) as const;
  expect(jobHash(job('charge', { a: 1, b: 2 }))).toBe(jobHash(job('charge', { b: 2, a: 1 })));
  expect(jobHash(job('charge', { a: 1 }))).not.toBe(jobHash(job('refund', { a: 1 })));
  expect(jobHash(job('charge', { a: 1 }))).not.toBe(jobHash(job('charge', { a: 2 })));
});

test('the store is down: the job goes back to delayed, is not failed and counts no attempt, fn does not run', async () => {
  let calls = 0;
  const h = await harness('store-down', () => ++calls, { store: brokenStore(), inProgressDelay: 100 });
  const id = await h.add({ orderId: 'during-outage' }, { attempts: 2 });
  await waitUntil(() => h.events.length >= 3, 'three delays');
  await waitUntil(async () => (await h.state(id)) === 'delayed', 'the job to be delayed');
  const job = await h.queue.getJob(id);
  expect(job?.attemptsMade).toBe(0);
  expect(job?.failedReason).toBeUndefined();
  expect(calls).toBe(0);
  expect(new Set(reasons(h.events))).toEqual(new Set(['delay:store-error']));
  expect(h.events.every((e) => e.failures === 0)).toBe(true);
});

test('option mistakes throw IdempotencyOptionsError at construction, naming the option and the fix', () => {
  const fn = () => null;
  const key = (job: OrderJob) => job.data.orderId;
  const attempt = (options: unknown) => () =>
    idempotentProcessor(fn, options as BullmqProcessorOptions<OrderJob>);
  const optionOf = (f: () => unknown): string | undefined => {
    try {
      f();
    } catch (error) {
      if (error instanceof IdempotencyOptionsError) return `${error.option}: ${error.message}`;
      throw error;
    }
    return undefined;
  };
  expect(optionOf(attempt({ key, maxAttempts: 3 }))).toMatch(/^maxAttempts: .*attempts: 5, backoff/);
  expect(optionOf(attempt({ key, retryDelay: '1s' }))).toMatch(/^retryDelay: .*backoff/);
  expect(optionOf(attempt({}))).toMatch(/^key: .*required.*Not job\.id/);
  expect(optionOf(attempt({ key: 'orderId' }))).toMatch(/^key: /);
  expect(optionOf(attempt(undefined))).toMatch(/^options: /);
  expect(optionOf(attempt({ key, keys: key }))).toMatch(
    /^keys: .*not an option of @oncely\/bullmq; known options: .*key/,
  );
  expect(optionOf(attempt({ key, onMissingKey: 'drop' }))).toMatch(/^onMissingKey: /);
  expect(optionOf(attempt({ key, inProgressDelay: 'soon' }))).toMatch(/^inProgressDelay: /);
  expect(optionOf(attempt({ key, fingerprint: 'name' }))).toMatch(/^fingerprint: /);
  expect(optionOf(attempt({ key, store: {} }))).toMatch(/^store: /);
  expect(optionOf(attempt({ key, isPermanent: true }))).toMatch(/^isPermanent: /);
  expect(optionOf(attempt({ key, onSettled: 'log' }))).toMatch(/^onSettled: /);
  expect(optionOf(attempt({ key, lockTimeout: 'forever' }))).toMatch(/^lockTimeout: /);
  expect(optionOf(() => idempotentProcessor('fn' as unknown as typeof fn, { key }))).toMatch(/^fn: /);
  expect(optionOf(attempt({ key }))).toBeUndefined();
});

// --- review findings -------------------------------------------------------------------------------------------

test("an idempotency error thrown by fn itself (an inner idempotent() call) is fn's failure: the job never completes", async () => {
  // The inner call's result cannot be stored: it throws UnstorableResultError, and fn stops before its own work.
  const inner = idempotent(() => ({ total: BigInt(1) }) as unknown, {
    store: newStore(),
    key: () => 'inner',
  });
  let finished = 0;
  const h = await harness(
    'inner-unstorable',
    async () => {
      await inner();
      finished++;
      return 'done';
    },
    { store: newStore() },
  );
  const job = await h.settled(await h.add({ orderId: 'inner-1' }, { attempts: 2, backoff: 50 }));
  expect(finished).toBe(0);
  expect(await h.state(job.id as string)).toBe('failed');
  expect(job.attemptsMade).toBe(2);
  expect(job.failedReason).toMatch(/BigInt|could not be stored/);
  expect(reasons(h.events)).toEqual(['retry:failed', 'dead-letter:retries-exhausted']);
});

test("an inner call whose key is in progress is fn's failure too: retried per attempts, not delayed for ever", async () => {
  const innerStore = newStore();
  await innerStore.acquire('held', { fingerprint: '', lockTimeoutMs: 60_000 }); // held by someone else
  const inner = idempotent(() => 'x', { store: innerStore, key: () => 'held' });
  let calls = 0;
  const h = await harness(
    'inner-in-progress',
    async () => {
      calls++;
      return inner();
    },
    { store: newStore(), inProgressDelay: 50 },
  );
  const job = await h.settled(await h.add({ orderId: 'inner-2' }, { attempts: 2, backoff: 50 }));
  expect(await h.state(job.id as string)).toBe('failed');
  expect([job.attemptsMade, calls]).toEqual([2, 2]);
  expect(reasons(h.events)).toEqual(['retry:failed', 'dead-letter:retries-exhausted']);
});

test("fn throwing BullMQ's UnrecoverableError: failed at once, reported and stored as permanent, duplicates not run", async () => {
  let calls = 0;
  const h = await harness(
    'unrecoverable',
    () => {
      calls++;
      throw new UnrecoverableError('card declined');
    },
    { store: newStore() },
  );
  const a = await h.settled(await h.add({ orderId: 'u-1' }, { attempts: 3 }));
  const b = await h.settled(await h.add({ orderId: 'u-1' }, { attempts: 3 }));
  expect([await h.state(a.id as string), await h.state(b.id as string)]).toEqual(['failed', 'failed']);
  expect([a.attemptsMade, b.attemptsMade, calls]).toEqual([1, 1, 1]);
  expect([a.failedReason, b.failedReason]).toEqual(['card declined', 'card declined']);
  expect(reasons(h.events)).toEqual(['dead-letter:permanent', 'dead-letter:permanent']);
});

test("fn moving its own job to delayed (BullMQ's DelayedError step pattern) is neither a failure nor permanent", async () => {
  const stepped = (isPermanent?: (error: unknown) => boolean) => {
    let runs = 0;
    return {
      runs: () => runs,
      fn: async (job: OrderJob, token?: string) => {
        runs++;
        if (runs === 1) {
          await job.moveToDelayed(Date.now() + 50, token);
          throw new DelayedError();
        }
        return `step ${runs}`;
      },
      options: { store: newStore(), ...(isPermanent ? { isPermanent } : {}) },
    };
  };
  // Default options: the job completes on its second run; it was never reported as failed or dead-lettered.
  const plain = stepped();
  const h = await harness('own-delay', plain.fn, plain.options);
  const job = await h.settled(await h.add({ orderId: 'step' }));
  expect([await h.state(job.id as string), job.returnvalue, plain.runs()]).toEqual([
    'completed',
    'step 2',
    2,
  ]);
  expect(reasons(h.events)).toEqual(['ack:executed']);
  // An isPermanent that calls every error but a TypeError permanent must not turn the move into a failure.
  const strict = stepped((error) => !(error instanceof TypeError));
  const s = await harness('own-delay-strict', strict.fn, strict.options);
  const sjob = await s.settled(await s.add({ orderId: 'step' }));
  expect([await s.state(sjob.id as string), sjob.returnvalue, strict.runs()]).toEqual([
    'completed',
    'step 2',
    2,
  ]);
});

test('an async onSettled that rejects is logged, never an unhandled rejection', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const logged: unknown[] = [];
    const noop = () => {};
    const processor = idempotentProcessor(() => 'ok', {
      store: newStore(),
      key: (job: OrderJob) => job.data.orderId,
      logger: { debug: noop, info: noop, warn: noop, error: (obj) => void logged.push(obj) },
      onSettled: async () => {
        throw new Error('metrics backend down');
      },
    });
    const job = { id: '1', name: 'charge', data: { orderId: 'async-hook' }, attemptsMade: 0 } as OrderJob;
    expect(await processor(job, 'token')).toBe('ok');
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(unhandled).toEqual([]);
    expect(logged).toHaveLength(1);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('the lease is renewed while a long job runs: a duplicate arriving after several lockTimeouts is delayed, not run', async () => {
  let runs = 0;
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const h = await harness(
    'long-job',
    async () => {
      runs++;
      await gate;
      return { run: runs };
    },
    { store: newStore(), lockTimeout: 300, inProgressDelay: 100 },
    2,
  );
  const a = await h.add({ orderId: 'long' });
  await waitUntil(() => runs === 1, 'the first job to start');
  await new Promise((resolve) => setTimeout(resolve, 1000)); // more than three lockTimeouts
  const b = await h.add({ orderId: 'long' });
  await waitUntil(() => h.events.some((e) => e.action === 'delay'), 'the duplicate to be delayed');
  release();
  const [ja, jb] = [await h.settled(a), await h.settled(b)];
  expect(runs).toBe(1);
  expect([ja.returnvalue, jb.returnvalue]).toEqual([{ run: 1 }, { run: 1 }]);
  expect(reasons(h.events).filter((r) => r.startsWith('ack:'))).toEqual(['ack:executed', 'ack:replayed']);
});

test("BullMQ's lock lost while fn still runs: the recovered job is delayed as in progress, then replays; fn runs once", async () => {
  const name = `lock-lost-${randomUUID().slice(0, 6)}`;
  const queue = new Queue<Order>(name, { connection: redis, prefix });
  queues.push(queue);
  const events: BullmqSettledEvent<OrderJob>[] = [];
  let runs = 0;
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const processor = idempotentProcessor(
    async () => {
      runs++;
      await gate;
      return { run: runs };
    },
    {
      store: newStore(),
      key: (job: OrderJob) => job.data.orderId,
      inProgressDelay: 100,
      onSettled: (event) => void events.push(event),
    },
  );
  const errors: unknown[] = [];
  for (let i = 0; i < 2; i++) {
    const worker = new Worker<Order>(name, processor, {
      connection: redis,
      prefix,
      concurrency: 2,
      lockDuration: 1000,
      stalledInterval: 300,
    });
    worker.on('error', (error) => void errors.push(error));
    workers.push(worker);
  }
  const id = (await queue.add('charge', { orderId: 'lost-lock' })).id as string;
  await waitUntil(() => runs === 1, 'fn to start');
  await redis.del(`${prefix}:${name}:${id}:lock`); // the lock is gone (a Redis failover, a long event-loop stall)
  await waitUntil(
    () => events.some((e) => e.action === 'delay'),
    'the recovered job to find its key in progress',
  );
  expect(runs).toBe(1);
  release();
  await waitUntil(async () => (await queue.getJobState(id)) === 'completed', 'the job to complete');
  const job = (await queue.getJob(id)) as Job<Order>;
  expect(runs).toBe(1);
  expect(job.returnvalue).toEqual({ run: 1 });
  expect(job.attemptsMade).toBe(1);
  // BullMQ refused the first run's own completion (the lock was not its any more) and said so.
  await waitUntil(
    () => errors.some((e) => /lock/i.test(String((e as Error).message))),
    'the worker error about the lock',
  );
  expect(events.map((e) => `${e.action}:${e.reason}`).filter((r) => r.startsWith('ack:'))).toEqual([
    'ack:executed',
    'ack:replayed',
  ]);
});

test('fn throwing a non-Error: the job fails with its message, not "[object Object]"', async () => {
  const h = await harness(
    'non-error',
    (job) => {
      if (job.data.orderId === 'string') throw 'card declined';
      if (job.data.orderId === 'object') throw { message: 'insufficient funds', code: 'E_FUNDS' };
      throw { message: 'blocked card', permanent: true };
    },
    { store: newStore(), isPermanent: (e) => (e as { permanent?: boolean }).permanent === true },
  );
  const a = await h.settled(await h.add({ orderId: 'string' }));
  const b = await h.settled(await h.add({ orderId: 'object' }));
  const c = await h.settled(await h.add({ orderId: 'permanent' }, { attempts: 3 }));
  expect([a.failedReason, b.failedReason, c.failedReason]).toEqual([
    'card declined',
    'insufficient funds',
    'blocked card',
  ]);
  expect(c.attemptsMade).toBe(1);
  expect(reasons(h.events)).toEqual([
    'dead-letter:retries-exhausted',
    'dead-letter:retries-exhausted',
    'dead-letter:permanent',
  ]);
});
