/**
 * @services postgres
 */
import { randomUUID } from 'node:crypto';
import {
  IdempotencyInProgressError,
  IdempotencyOptionsError,
  idempotent,
  MemoryStore,
  PermanentError,
} from '@oncely/core';
import { idempotentWorker, type PgBossSettledEvent } from '@oncely/pg-boss';
import { PostgresStore } from '@oncely/postgres';
import { resumingWork, waitUntil } from '@oncely/testing';
import type { PoolClient } from 'pg';
import type PgBoss from 'pg-boss';
import { settledJob, testDatabase } from './helpers';

// Against the PostgreSQL on this machine: pg-boss, the store and the effects table live in schemas of this file's
// own (dropped in afterAll). Each test has a queue of its own.
jest.setTimeout(60_000);

const db = testDatabase();
let boss: PgBoss;
let store: PostgresStore;

beforeAll(async () => {
  boss = await db.boss();
  store = new PostgresStore({ pool: db.pool(), schema: db.schema });
  await store.migrate();
  await db
    .pool()
    .query(
      `CREATE TABLE "${db.schema}".shipments (id serial PRIMARY KEY, key text NOT NULL, n int NOT NULL)`,
    );
});
afterAll(() => db.drop());

type Data = { idempotencyKey?: string; n: number };
type Job = PgBoss.Job<Data>;

async function queue(options: Omit<PgBoss.Queue, 'name'> = {}): Promise<string> {
  const name = `q-${randomUUID()}`;
  await boss.createQueue(name, { retryLimit: 2, retryDelay: 0, expireInSeconds: 30, ...options, name });
  return name;
}

const send = async (name: string, data: Data): Promise<string> => (await boss.send(name, data)) as string;
const rows = async (key: string): Promise<number> =>
  (await db.pool().query(`SELECT count(*)::int AS n FROM "${db.schema}".shipments WHERE key = $1`, [key]))
    .rows[0].n;

function recorder() {
  const events: PgBossSettledEvent<Job>[] = [];
  return {
    events,
    onSettled: (event: PgBossSettledEvent<Job>) => events.push(event),
    /**
     * Waits (up to 10 s) until `count` settlements were reported: onSettled runs once boss.complete or boss.cancel
     * has resolved in the worker, which can be after the test's own connection already sees the job settled.
     */
    reported: (count: number) =>
      waitUntil(() => events.length >= count, `${count} settlements reported`, 10_000).catch(() => {}),
  };
}

const work = { pollingIntervalSeconds: 0.5, batchSize: 4 };

describe('plain mode (PostgresStore as an ordinary store)', () => {
  test('two jobs with the same key (different ids): fn runs once, both complete, the duplicate with the stored result', async () => {
    const name = await queue();
    const calls: string[] = [];
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async (job, { key }) => {
          calls.push(job.id);
          return { shipped: key, n: job.data.n };
        },
        { boss, store, onSettled },
      ),
    );
    const first = await send(name, { idempotencyKey: 'order-1', n: 1 });
    const firstJob = await settledJob(boss, name, first);
    const second = await send(name, { idempotencyKey: 'order-1', n: 1 });
    const secondJob = await settledJob(boss, name, second);
    expect(first).not.toBe(second);
    expect(calls).toEqual([first]);
    expect(firstJob.state).toBe('completed');
    expect(secondJob.state).toBe('completed');
    expect(firstJob.output).toEqual({ shipped: 'order-1', n: 1 });
    expect(secondJob.output).toEqual({ shipped: 'order-1', n: 1 });
    await reported(2);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual(['ack:executed', 'ack:replayed']);
    await boss.offWork(name);
  });

  test('a duplicate of a job still running waits in the worker (no attempt counted), then completes as a replay', async () => {
    const name = await queue({ retryLimit: 0 });
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let calls = 0;
    const { events, onSettled } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          calls++;
          await gate;
          return { done: true };
        },
        { boss, store, onSettled, inProgressDelay: '100ms' },
      ),
    );
    // One batch: both jobs run side by side; the second finds the key held by the first.
    await boss.insert([
      { name, data: { idempotencyKey: 'slow', n: 1 } },
      { name, data: { idempotencyKey: 'slow', n: 1 } },
    ]);
    await waitUntil(() => events.filter((e) => e.action === 'delay').length >= 3, 'the duplicate to wait');
    release();
    await waitUntil(() => events.filter((e) => e.action === 'ack').length === 2, 'both jobs acked');
    expect(calls).toBe(1);
    expect(new Set(events.filter((e) => e.action === 'delay').map((e) => e.reason))).toEqual(
      new Set(['in-progress']),
    );
    const ids = [...new Set(events.map((e) => e.message.id))];
    expect(ids).toHaveLength(2);
    for (const id of ids) {
      const job = await settledJob(boss, name, id);
      // retryLimit 0: a failed (or counted) attempt would have failed it for good.
      expect(job.state).toBe('completed');
      expect(job.retryCount).toBe(0);
      expect(job.output).toEqual({ done: true });
    }
    await boss.offWork(name);
  });

  test('a duplicate that would outwait its expireInSeconds is left to pg-boss to retry (one attempt counted), then replays', async () => {
    const slowQueue = await queue({ expireInSeconds: 30 });
    const shortQueue = await queue({ expireInSeconds: 1, retryLimit: 5, retryDelay: 0 });
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let calls = 0;
    const { events, onSettled } = recorder();
    const handler = idempotentWorker<Job>(
      async () => {
        calls++;
        await gate;
        return { done: true };
      },
      { boss, store, onSettled, inProgressDelay: '100ms' },
    );
    await boss.work<Data>(slowQueue, work, handler);
    await boss.work<Data>(shortQueue, { ...work, includeMetadata: true }, handler);
    // The same key in two queues (one store): the short-lived job cannot wait for the slow one within 1 s.
    await send(slowQueue, { idempotencyKey: 'long-held', n: 1 });
    await waitUntil(() => calls === 1, 'the slow job to start');
    const id = await send(shortQueue, { idempotencyKey: 'long-held', n: 1 });
    await waitUntil(async () => ((await boss.getJobById(shortQueue, id))?.retryCount ?? 0) >= 1, 'a retry');
    release();
    const job = await settledJob(boss, shortQueue, id);
    expect(job.state).toBe('completed');
    expect(job.retryCount).toBeGreaterThanOrEqual(1);
    expect(job.output).toEqual({ done: true });
    expect(calls).toBe(1);
    expect(events.filter((e) => e.message.id === id).at(-1)?.reason).toBe('replayed');
    // Handing the job back costs it an attempt: the event says so (a retry, one failure), not "delay".
    const handedBack = events.filter((e) => e.message.id === id && e.action === 'retry');
    expect(handedBack.length).toBeGreaterThanOrEqual(1);
    expect(handedBack[0]).toMatchObject({ reason: 'in-progress', failures: 1, delayMs: 0 });
    await boss.offWork(slowQueue);
    await boss.offWork(shortQueue);
  });

  test('a failing fn is retried per the queue’s retryLimit, then the job fails', async () => {
    const name = await queue({ retryLimit: 2, retryDelay: 0 });
    let calls = 0;
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      { ...work, includeMetadata: true },
      idempotentWorker<PgBoss.JobWithMetadata<Data>>(
        async () => {
          calls++;
          throw new Error('payment provider down');
        },
        {
          boss,
          store,
          onSettled: onSettled as (e: PgBossSettledEvent<PgBoss.JobWithMetadata<Data>>) => void,
        },
      ),
    );
    const id = await send(name, { idempotencyKey: 'flaky', n: 1 });
    const job = await settledJob(boss, name, id);
    expect(job.state).toBe('failed');
    expect(calls).toBe(3); // the first attempt and two retries
    expect(job.retryCount).toBe(2);
    expect(job.output).toMatchObject({ message: 'payment provider down' });
    // The last failure is final (retryCount reached retryLimit): pg-boss fails the job for good, and says so. The
    // retries come back after the queue's retryDelay (0 s), not after a delay of oncely's own.
    await reported(3);
    expect(events.map((e) => `${e.action}:${e.failures}:${e.delayMs}`)).toEqual([
      'retry:1:0',
      'retry:2:0',
      'dead-letter:3:undefined',
    ]);
    expect(events.at(-1)?.reason).toBe('retries-exhausted');
    // The key was released each time: nothing is recorded for it.
    expect(await store.get('flaky')).toBeUndefined();
    await boss.offWork(name);
  });

  test('a permanent error: cancelled at once, not retried; a later duplicate is cancelled without running', async () => {
    const name = await queue({ retryLimit: 3, retryDelay: 0 });
    let calls = 0;
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          calls++;
          throw new PermanentError('amount must be positive', { code: 'invalid_amount' });
        },
        { boss, store, onSettled },
      ),
    );
    const first = await settledJob(boss, name, await send(name, { idempotencyKey: 'bad', n: -1 }));
    const second = await settledJob(boss, name, await send(name, { idempotencyKey: 'bad', n: -1 }));
    expect(calls).toBe(1);
    expect(first.state).toBe('cancelled');
    expect(first.retryCount).toBe(0);
    expect(second.state).toBe('cancelled');
    await reported(2);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual([
      'dead-letter:permanent',
      'dead-letter:permanent',
    ]);
    await boss.offWork(name);
  });

  test('a job without a key is cancelled without running; onMissingKey: process runs it', async () => {
    const name = await queue();
    let calls = 0;
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          calls++;
          return null;
        },
        { boss, store, onSettled },
      ),
    );
    const job = await settledJob(boss, name, await send(name, { n: 1 }));
    expect(job.state).toBe('cancelled');
    expect(calls).toBe(0);
    await reported(1);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual(['dead-letter:missing-key']);
    await boss.offWork(name);

    const other = await queue();
    await boss.work<Data>(
      other,
      work,
      idempotentWorker<Job>(
        async (_job, { key }) => {
          calls++;
          return { key: key ?? 'none' };
        },
        { boss, store, onMissingKey: 'process' },
      ),
    );
    const processed = await settledJob(boss, other, await send(other, { n: 1 }));
    expect(processed.state).toBe('completed');
    expect(processed.output).toEqual({ key: 'none' });
    expect(calls).toBe(1);
    await boss.offWork(other);
  });

  test('a key reused for other data (fingerprint): the second job is cancelled without running', async () => {
    const name = await queue();
    const seen: number[] = [];
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async (job) => {
          seen.push(job.data.n);
          return null;
        },
        { boss, store, onSettled },
      ),
    );
    const first = await settledJob(boss, name, await send(name, { idempotencyKey: 'reused', n: 1 }));
    const second = await settledJob(boss, name, await send(name, { idempotencyKey: 'reused', n: 2 }));
    expect(first.state).toBe('completed');
    expect(second.state).toBe('cancelled');
    expect(seen).toEqual([1]);
    await reported(2);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual(['ack:executed', 'dead-letter:mismatch']);
    await boss.offWork(name);
  });

  test('a custom key function; a key function that returns a non-string cancels the job', async () => {
    const name = await queue();
    const keys: Array<string | undefined> = [];
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async (_job, { key }) => {
          keys.push(key);
          return null;
        },
        {
          boss,
          store,
          key: (job) => (job.data.n < 0 ? (job.data.n as unknown as string) : `custom:${job.data.n}`),
        },
      ),
    );
    expect((await settledJob(boss, name, await send(name, { n: 7 }))).state).toBe('completed');
    expect((await settledJob(boss, name, await send(name, { n: -1 }))).state).toBe('cancelled');
    expect(keys).toEqual(['custom:7']);
    await boss.offWork(name);
  });

  test('a key or fingerprint function that throws cancels the job without running it, reported and logged', async () => {
    const name = await queue();
    let runs = 0;
    const warnings: string[] = [];
    const log = (level: string) => (_obj: object, msg?: string) =>
      void (level === 'warn' && warnings.push(msg ?? ''));
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          runs++;
          return null;
        },
        {
          boss,
          store,
          onSettled,
          logger: { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') },
          key: (job) => {
            if (job.data.n === 1) throw new Error('no key here');
            return `throwing:${job.data.n}`;
          },
          fingerprint: (job) => {
            if (job.data.n === 2) throw new Error('no fingerprint here');
            return 'same';
          },
        },
      ),
    );
    expect((await settledJob(boss, name, await send(name, { n: 1 }))).state).toBe('cancelled');
    expect((await settledJob(boss, name, await send(name, { n: 2 }))).state).toBe('cancelled');
    await reported(2);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual([
      'dead-letter:invalid-key',
      'dead-letter:invalid-key',
    ]);
    expect(runs).toBe(0);
    expect(warnings.filter((w) => /cancelled/.test(w))).toHaveLength(2);
    await boss.offWork(name);
  });
});

test('one batch with a success, a permanent error and a transient failure: each job settled on its own', async () => {
  const name = await queue({ retryLimit: 1, retryDelay: 0 });
  const ids = {
    ok: await send(name, { idempotencyKey: 'batch-ok', n: 1 }),
    permanent: await send(name, { idempotencyKey: 'batch-permanent', n: 2 }),
    flaky: await send(name, { idempotencyKey: 'batch-flaky', n: 3 }),
  };
  const calls: string[] = [];
  const batches: number[] = [];
  const handler = idempotentWorker<Job>(
    async (job, { key }) => {
      calls.push(key as string);
      if (key === 'batch-permanent') throw new PermanentError('never');
      if (key === 'batch-flaky' && calls.filter((k) => k === key).length === 1) throw new Error('once');
      return { n: job.data.n };
    },
    { boss, store },
  );
  // Queued before the worker starts: its first fetch takes all three as one batch.
  await boss.work<Data>(name, work, async (jobs) => {
    batches.push(jobs.length);
    return handler(jobs);
  });
  const ok = await settledJob(boss, name, ids.ok);
  const permanent = await settledJob(boss, name, ids.permanent);
  const flaky = await settledJob(boss, name, ids.flaky);
  expect(batches[0]).toBe(3);
  expect([ok.state, ok.retryCount, ok.output]).toEqual(['completed', 0, { n: 1 }]);
  expect([permanent.state, permanent.retryCount]).toEqual(['cancelled', 0]);
  expect([flaky.state, flaky.retryCount, flaky.output]).toEqual(['completed', 1, { n: 3 }]);
  expect(calls.sort()).toEqual(['batch-flaky', 'batch-flaky', 'batch-ok', 'batch-permanent']);
  await boss.offWork(name);
});

/** The work's own write in transactional mode: one shipment row, on the transaction's client; its id. */
async function insertShipment(client: Pick<PoolClient, 'query'>, key: string, n: number): Promise<number> {
  const { rows } = await client.query<{ id: number }>(
    `INSERT INTO "${db.schema}".shipments (key, n) VALUES ($1, $2) RETURNING id`,
    [key, n],
  );
  return (rows[0] as { id: number }).id;
}

describe('transactional mode', () => {
  const ship = (fail?: (job: Job) => boolean) =>
    idempotentWorker(
      async (job: Job, { key, db: client }) => {
        const shipment = await insertShipment(client, key, job.data.n);
        if (fail?.(job)) throw new Error('failed after writing');
        return { shipment };
      },
      { boss, store, transactional: true },
    );

  test('fn’s write and the record commit together; a duplicate job completes with the stored result', async () => {
    const name = await queue();
    await boss.work<Data>(name, work, ship());
    const first = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-1', n: 1 }));
    const second = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-1', n: 1 }));
    expect(first.state).toBe('completed');
    expect(second.state).toBe('completed');
    expect(second.output).toEqual(first.output);
    expect(first.output).toEqual({ shipment: expect.any(Number) });
    expect(await rows('tx-1')).toBe(1);
    expect((await store.get('tx-1'))?.state).toBe('completed');
    await boss.offWork(name);
  });

  test('a throw rolls back both the write and the record; the retry runs again and commits once', async () => {
    const name = await queue({ retryLimit: 2, retryDelay: 0 });
    let attempts = 0;
    let rowsSeenByRetry = -1;
    await boss.work<Data>(
      name,
      work,
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          attempts++;
          // The retry looks from outside its transaction: the failed attempt must have left no row behind.
          if (attempts === 2) rowsSeenByRetry = await rows('tx-2');
          await insertShipment(client, key, job.data.n);
          if (attempts === 1) throw new Error('failed after writing');
          return { attempt: attempts };
        },
        { boss, store, transactional: true },
      ),
    );
    const job = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-2', n: 2 }));
    expect(attempts).toBe(2);
    expect(rowsSeenByRetry).toBe(0);
    expect(job.state).toBe('completed');
    expect(job.retryCount).toBe(1);
    expect(job.output).toEqual({ attempt: 2 });
    expect(await rows('tx-2')).toBe(1);
    expect((await store.get('tx-2'))?.state).toBe('completed');
    await boss.offWork(name);
  });

  test('a throw on the last attempt leaves neither row nor record', async () => {
    const name = await queue({ retryLimit: 0 });
    await boss.work<Data>(
      name,
      work,
      ship(() => true),
    );
    const job = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-3', n: 3 }));
    expect(job.state).toBe('failed');
    expect(await rows('tx-3')).toBe(0);
    expect(await store.get('tx-3')).toBeUndefined();
    await boss.offWork(name);
  });

  test.each([
    // An inner call whose result cannot be stored: UnstorableResultError, "executed", about the inner key.
    [
      'UnstorableResultError',
      (key: string) =>
        idempotent(async (): Promise<unknown> => undefined, {
          store: new MemoryStore(),
          key: () => `inner-${key}`,
        })(),
    ],
    // Settled as a conflict on this job's key, it would be delayed in the worker and run again, attempt uncounted.
    [
      'IdempotencyInProgressError',
      async (key: string) => {
        throw new IdempotencyInProgressError(`inner-${key}`, 1_000);
      },
    ],
  ] as const)(
    'an oncely error thrown by fn (an inner idempotent() call’s %s) is fn failing: the write rolls back and the job is retried, never completed on it',
    async (name, innerCall) => {
      const queueName = await queue({ retryLimit: 1, retryDelay: 0 });
      let runs = 0;
      await boss.work<Data>(
        queueName,
        work,
        idempotentWorker(
          async (job: Job, { key, db: client }) => {
            runs++;
            await insertShipment(client, key, job.data.n);
            if (runs === 1) await innerCall(key);
            return { run: runs };
          },
          { boss, store, transactional: true },
        ),
      );
      const key = `tx-inner-${name}`;
      const job = await settledJob(boss, queueName, await send(queueName, { idempotencyKey: key, n: 4 }));
      expect(job.state).toBe('completed');
      expect(job.retryCount).toBe(1);
      expect(runs).toBe(2);
      expect(job.output).toEqual({ run: 2 });
      expect(await rows(key)).toBe(1);
      await boss.offWork(queueName);
    },
  );

  test('a store that fails to begin the transaction: delayed as a store error (no attempt counted, decision store_error), then run once', async () => {
    const name = await queue({ retryLimit: 0 });
    const decisions: string[] = [];
    const { events, onSettled, reported } = recorder();
    let failures = 1;
    // The PostgresStore, except that its first acquire fails as a database that is down would.
    const flaky = Object.create(store, {
      acquireInTransaction: {
        value: (...args: Parameters<PostgresStore['acquireInTransaction']>) =>
          failures-- > 0
            ? Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:5432'))
            : store.acquireInTransaction(...args),
      },
    }) as PostgresStore;
    let runs = 0;
    await boss.work<Data>(
      name,
      work,
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          runs++;
          return { shipment: await insertShipment(client, key, job.data.n) };
        },
        {
          boss,
          store: flaky,
          transactional: true,
          inProgressDelay: 100,
          onSettled,
          hooks: { onDecision: (event) => decisions.push(event.outcome) },
        },
      ),
    );
    const job = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-store-down', n: 6 }));
    // With retryLimit 0, a failure counted against the job would have failed it.
    expect(job.state).toBe('completed');
    expect(runs).toBe(1);
    expect(await rows('tx-store-down')).toBe(1);
    expect(decisions).toEqual(['store_error', 'executed']);
    await reported(2);
    expect(events.map((event) => `${event.action}:${event.reason}`)).toEqual([
      'delay:store-error',
      'ack:executed',
    ]);
    await boss.offWork(name);
  });

  test('hooks see the transactional path as the plain one: acquire, commit (complete) and rollback (release) timed, the work in flight', async () => {
    const name = await queue({ retryLimit: 1, retryDelay: 0 });
    const operations: string[] = [];
    const inFlight: number[] = [];
    let active = 0;
    let attempts = 0;
    await boss.work<Data>(
      name,
      work,
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          attempts++;
          inFlight.push(active);
          await insertShipment(client, key, job.data.n);
          if (attempts === 1) throw new Error('failed after writing');
          return { attempt: attempts };
        },
        {
          boss,
          store,
          transactional: true,
          hooks: {
            onStoreOperation: (event) => {
              expect(event.durationMs).toBeGreaterThanOrEqual(0);
              expect(event.adapter).toBe('consumer');
              operations.push(`${event.operation}:${event.result}`);
            },
            onExecutionStart: () => void active++,
            onExecutionEnd: () => void active--,
          },
        },
      ),
    );
    const first = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-hooks', n: 1 }));
    const duplicate = await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-hooks', n: 1 }));
    expect([first.state, duplicate.state]).toEqual(['completed', 'completed']);
    expect(attempts).toBe(2);
    // The work ran inside an execution both times, and none is left in flight.
    expect(inFlight).toEqual([1, 1]);
    expect(active).toBe(0);
    // Attempt 1: acquire, rollback; attempt 2: acquire, commit; the duplicate: acquire (a replay).
    expect(operations).toEqual(['acquire:ok', 'release:ok', 'acquire:ok', 'complete:ok', 'acquire:ok']);
    expect(await rows('tx-hooks')).toBe(1);
    await boss.offWork(name);
  });

  test('a duplicate of a running transaction waits, then completes as a replay; one row', async () => {
    const name = await queue({ retryLimit: 0 });
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const { events, onSettled } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          await insertShipment(client, key, job.data.n);
          await gate;
          return { n: job.data.n };
        },
        { boss, store, transactional: true, onSettled, inProgressDelay: '100ms' },
      ),
    );
    await boss.insert([
      { name, data: { idempotencyKey: 'tx-4', n: 4 } },
      { name, data: { idempotencyKey: 'tx-4', n: 4 } },
    ]);
    await waitUntil(() => events.filter((e) => e.action === 'delay').length >= 2, 'the duplicate to wait');
    release();
    await waitUntil(() => events.filter((e) => e.action === 'ack').length === 2, 'both acked');
    expect(
      events
        .filter((e) => e.action === 'ack')
        .map((e) => e.reason)
        .sort(),
    ).toEqual(['executed', 'replayed']);
    for (const id of new Set(events.map((e) => e.message.id))) {
      const job = await settledJob(boss, name, id);
      expect(job.state).toBe('completed');
      expect(job.output).toEqual({ n: 4 });
    }
    expect(await rows('tx-4')).toBe(1);
    await boss.offWork(name);
  });
  test('a key reused for other data, or too long, is cancelled without running; fingerprint: false replays', async () => {
    const name = await queue();
    const seen: string[] = [];
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          seen.push(`${key}:${job.data.n}`);
          await insertShipment(client, key, job.data.n);
          return null;
        },
        { boss, store, transactional: true, onSettled, maxKeyLength: 20 },
      ),
    );
    expect((await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-5', n: 1 }))).state).toBe(
      'completed',
    );
    expect((await settledJob(boss, name, await send(name, { idempotencyKey: 'tx-5', n: 2 }))).state).toBe(
      'cancelled',
    );
    const long = 'x'.repeat(21);
    expect((await settledJob(boss, name, await send(name, { idempotencyKey: long, n: 1 }))).state).toBe(
      'cancelled',
    );
    expect(seen).toEqual(['tx-5:1']);
    expect(await rows('tx-5')).toBe(1);
    await reported(3);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual([
      'ack:executed',
      'dead-letter:mismatch',
      'dead-letter:invalid-key',
    ]);
    await boss.offWork(name);

    const lenient = await queue();
    await boss.work<Data>(
      lenient,
      work,
      idempotentWorker(async (job: Job) => ({ n: job.data.n }), {
        boss,
        store,
        transactional: true,
        fingerprint: false,
      }),
    );
    await settledJob(boss, lenient, await send(lenient, { idempotencyKey: 'tx-6', n: 1 }));
    const replay = await settledJob(boss, lenient, await send(lenient, { idempotencyKey: 'tx-6', n: 2 }));
    expect([replay.state, replay.output]).toEqual(['completed', { n: 1 }]);
    await boss.offWork(lenient);
  });
});

describe('settling, keys and waits (review findings)', () => {
  test('a boss.complete or boss.cancel that fails once is tried again: a done job is not failed on its last attempt', async () => {
    const name = await queue({ retryLimit: 0 });
    const ids = { ok: randomUUID(), permanent: randomUUID() };
    await boss.insert([
      { id: ids.ok, name, data: { idempotencyKey: 'settle-ok', n: 1 } },
      { id: ids.permanent, name, data: { idempotencyKey: 'settle-permanent', n: 2 } },
    ]);
    const failed = { complete: 0, cancel: 0 };
    const blip = () => Promise.reject(new Error('Connection terminated unexpectedly'));
    const flakyBoss = {
      complete: (queueName: string, id: string, data: object) =>
        failed.complete++ === 0 ? blip() : boss.complete(queueName, id, data),
      cancel: (queueName: string, id: string) =>
        failed.cancel++ === 0 ? blip() : boss.cancel(queueName, id),
    };
    const calls: string[] = [];
    const { events, onSettled, reported } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async (job, { key }) => {
          calls.push(key as string);
          if (key === 'settle-permanent') throw new PermanentError('never');
          return { n: job.data.n };
        },
        { boss: flakyBoss, store, onSettled },
      ),
    );
    const ok = await settledJob(boss, name, ids.ok);
    const permanent = await settledJob(boss, name, ids.permanent);
    // retryLimit 0: handing a job back to pg-boss after a blip would have failed it for good (its effect done).
    expect([ok.state, ok.retryCount, ok.output]).toEqual(['completed', 0, { n: 1 }]);
    expect([permanent.state, permanent.retryCount]).toEqual(['cancelled', 0]);
    await reported(2);
    expect(events.map((e) => `${e.key}:${e.action}`).sort()).toEqual([
      'settle-ok:ack',
      'settle-permanent:dead-letter',
    ]);
    expect(calls.sort()).toEqual(['settle-ok', 'settle-permanent']);
    expect(failed.complete).toBe(2);
    expect(failed.cancel).toBe(2);
    await boss.offWork(name);
  });

  test('fn gets the key that was protected: the key function runs once per decision', async () => {
    const name = await queue();
    let keyCalls = 0;
    const seen: Array<string | undefined> = [];
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async (_job, { key }) => {
          seen.push(key);
          return null;
        },
        {
          boss,
          store,
          // A key function that answers differently on each call (a bug of the caller's, but fn must still see
          // the key whose record guards it).
          key: () => `counted-${name}-${++keyCalls}`,
        },
      ),
    );
    const job = await settledJob(boss, name, await send(name, { n: 1 }));
    expect(job.state).toBe('completed');
    expect(keyCalls).toBe(1);
    expect(seen).toEqual([`counted-${name}-1`]);
    expect((await store.get(`counted-${name}-1`))?.state).toBe('completed');
    await boss.offWork(name);
  });

  test('with inProgress: { wait }, a held key is looked at again only if that look’s own wait ends before expiry', async () => {
    const slowQueue = await queue({ expireInSeconds: 30 });
    const shortQueue = await queue({ expireInSeconds: 3, retryLimit: 0 });
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let calls = 0;
    const { events, onSettled } = recorder();
    const handler = idempotentWorker<Job>(
      async () => {
        calls++;
        await gate;
        return { done: true };
      },
      { boss, store, onSettled, inProgressDelay: '100ms', inProgress: { wait: '2s' } },
    );
    try {
      await boss.work<Data>(slowQueue, work, handler);
      await boss.work<Data>(shortQueue, { ...work, includeMetadata: true }, handler);
      await send(slowQueue, { idempotencyKey: 'held-while-waiting', n: 1 });
      await waitUntil(() => calls === 1, 'the slow job to start');
      const id = await send(shortQueue, { idempotencyKey: 'held-while-waiting', n: 1 });
      const job = await settledJob(boss, shortQueue, id);
      // Handed back by the wrapper (its JobsToRetryError), not cut off by pg-boss's handler timeout in the middle
      // of a second 2 s wait that could not end before the job's 3 s expiry.
      expect(job.state).toBe('failed');
      expect((job.output as { message?: string }).message).toContain('in-progress');
      expect(events.filter((e) => e.message.id === id).at(-1)).toMatchObject({
        action: 'dead-letter',
        reason: 'retries-exhausted',
      });
    } finally {
      release();
      await boss.offWork(slowQueue);
      await boss.offWork(shortQueue);
    }
  });

  test('plain mode: a job running longer than lockTimeout keeps its key (the lease is renewed); the duplicate never runs', async () => {
    const name = await queue({ retryLimit: 0 });
    let calls = 0;
    let running = 0;
    let overlapped = false;
    const { events, onSettled } = recorder();
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          calls++;
          running++;
          if (running > 1) overlapped = true;
          await new Promise((resolve) => setTimeout(resolve, 2000));
          running--;
          return { done: true };
        },
        { boss, store, onSettled, lockTimeout: '500ms', inProgressDelay: '100ms' },
      ),
    );
    await boss.insert([
      { name, data: { idempotencyKey: `lease-${name}`, n: 1 } },
      { name, data: { idempotencyKey: `lease-${name}`, n: 1 } },
    ]);
    await waitUntil(() => events.filter((e) => e.action === 'ack').length === 2, 'both jobs acked');
    expect(calls).toBe(1);
    expect(overlapped).toBe(false);
    expect(
      events
        .filter((e) => e.action === 'ack')
        .map((e) => e.reason)
        .sort(),
    ).toEqual(['executed', 'replayed']);
    await boss.offWork(name);
  });

  test('transactional mode: a job expired by pg-boss while its transaction runs is fetched again, finds the key held, and the write happens once', async () => {
    const name = await queue({ expireInSeconds: 1, retryLimit: 20, retryDelay: 0 });
    let calls = 0;
    await boss.work<Data>(
      name,
      { ...work, includeMetadata: true },
      idempotentWorker(
        async (job: Job, { key, db: client }) => {
          calls++;
          await insertShipment(client, key, job.data.n);
          // Far past the job's 1 s expiry: pg-boss fails the job (and fetches it again) while this runs.
          await new Promise((resolve) => setTimeout(resolve, 3500));
          return { n: job.data.n };
        },
        { boss, store, transactional: true, inProgressDelay: '100ms' },
      ),
    );
    const id = await send(name, { idempotencyKey: `expired-tx-${name}`, n: 9 });
    const job = await settledJob(boss, name, id, 30_000);
    expect(job.state).toBe('completed');
    expect(job.retryCount).toBeGreaterThanOrEqual(1); // it really was expired and fetched again
    expect(job.output).toEqual({ n: 9 });
    expect(calls).toBe(1);
    expect(await rows(`expired-tx-${name}`)).toBe(1);
    await boss.offWork(name);
  });

  test('a job waiting for a held key stops waiting once its PgBoss has stopped (no wait until expiry, no fn after shutdown)', async () => {
    const slowQueue = await queue({ expireInSeconds: 60 });
    const waitingQueue = await queue({ expireInSeconds: 60 });
    const other = await db.boss();
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let calls = 0;
    let returned = false;
    const { events, onSettled } = recorder();
    const fn = async () => {
      calls++;
      await gate;
      return { done: true };
    };
    try {
      await boss.work<Data>(slowQueue, work, idempotentWorker<Job>(fn, { boss, store }));
      const waiting = idempotentWorker<Job>(fn, { boss: other, store, onSettled, inProgressDelay: '100ms' });
      await other.work<Data>(waitingQueue, work, async (jobs) => {
        try {
          await waiting(jobs);
        } finally {
          returned = true;
        }
      });
      await send(slowQueue, { idempotencyKey: `stop-${slowQueue}`, n: 1 });
      await waitUntil(() => calls === 1, 'the slow job to start');
      await send(waitingQueue, { idempotencyKey: `stop-${slowQueue}`, n: 1 });
      await waitUntil(() => events.some((e) => e.action === 'delay'), 'the duplicate to wait');
      await other.stop({ graceful: false, wait: true });
      // Its expiry is 60 s away: before the fix the handler kept looking at the key until then.
      await waitUntil(() => returned, 'the waiting handler to return after stop()', 10_000);
      expect(events.at(-1)).toMatchObject({ action: 'retry', reason: 'in-progress' });
      release();
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(calls).toBe(1);
    } finally {
      release();
      await boss.offWork(slowQueue);
    }
  });

  test('transactional mode: a COMMIT that fails (a deferred constraint) does not complete the job, and leaves no record', async () => {
    const name = await queue({ retryLimit: 1, retryDelay: 0 });
    const table = `"${db.schema}".deferred_${randomUUID().slice(0, 8)}`;
    await db.pool().query(`CREATE TABLE ${table} (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`);
    await db.pool().query(`INSERT INTO ${table} (v) VALUES (1)`);
    let calls = 0;
    const { events, onSettled } = recorder();
    await boss.work<Data>(
      name,
      { ...work, includeMetadata: true },
      idempotentWorker(
        async (job: Job, { db: client }) => {
          calls++;
          // Accepted now, refused at COMMIT: the work "finished" but its transaction cannot commit.
          await client.query(`INSERT INTO ${table} (v) VALUES ($1)`, [job.data.n]);
          return { n: job.data.n };
        },
        { boss, store, transactional: true, onSettled },
      ),
    );
    const id = await send(name, { idempotencyKey: `commit-fails-${name}`, n: 1 });
    const job = await settledJob(boss, name, id);
    expect(job.state).toBe('failed');
    expect(calls).toBe(2);
    expect(await store.get(`commit-fails-${name}`)).toBeUndefined();
    expect((await db.pool().query(`SELECT count(*)::int AS n FROM ${table}`)).rows[0].n).toBe(1);
    expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual([
      'retry:failed',
      'dead-letter:retries-exhausted',
    ]);
    expect(events[0]?.error).toMatchObject({ code: '23505' });
    await boss.offWork(name);
  });

  test('a cancelled job resumed with boss.resume: a stored permanent failure cancels it again until the record is deleted', async () => {
    const name = await queue();
    let calls = 0;
    await boss.work<Data>(
      name,
      work,
      idempotentWorker<Job>(
        async () => {
          calls++;
          if (calls === 1) throw new PermanentError('fix me');
          return { fixed: true };
        },
        { boss, store },
      ),
    );
    const id = await send(name, { idempotencyKey: `resume-${name}`, n: 1 });
    expect((await settledJob(boss, name, id)).state).toBe('cancelled');
    await boss.resume(name, id);
    expect((await settledJob(boss, name, id)).state).toBe('cancelled');
    expect(calls).toBe(1);
    await store.delete(`resume-${name}`);
    await boss.resume(name, id);
    const job = await settledJob(boss, name, id);
    expect([job.state, job.output]).toEqual(['completed', { fixed: true }]);
    expect(calls).toBe(2);
    await boss.offWork(name);
  });
});

describe('steps and currentIdempotency()', () => {
  test('plain mode: the retry after a failure replays the recorded step a without running it, then runs step b', async () => {
    const name = await queue({ retryLimit: 2, retryDelay: 0 });
    const { work: resuming, runs, seen } = resumingWork();
    const steps = new MemoryStore();
    await boss.work<Data>(name, work, idempotentWorker(resuming, { boss, store: steps }));
    const job = await settledJob(boss, name, await send(name, { idempotencyKey: 'steps-plain', n: 1 }));
    expect([job.state, job.retryCount, job.output]).toEqual(['completed', 1, { a: { n: 1 } }]);
    expect(runs).toEqual({ deliveries: 2, a: 1, b: 1 });
    expect(seen.map((s) => s.a)).toEqual([{ n: 1 }, { n: 1 }]);
    expect(seen[1]?.keyFor).toBe(seen[0]?.keyFor);
    await boss.offWork(name);
    await steps.close();
  });

  // In transactional mode a step is part of the transaction: a rolled-back attempt's steps are gone with its
  // writes, so the retry runs step a again. The context's db is the transaction's client, on either path.
  test.each([
    ['acquireInTransaction (the runtime runs the transaction)', () => store],
    [
      "the store's own transaction() (a store without acquireInTransaction)",
      () => ({
        acquire: store.acquire.bind(store),
        complete: store.complete.bind(store),
        release: store.release.bind(store),
        renew: store.renew.bind(store),
        transaction: store.transaction.bind(store),
      }),
    ],
  ])(
    'transactional mode through %s: the work runs in the context, steps run again after a rollback',
    async (_label, storeOf) => {
      const name = await queue({ retryLimit: 2, retryDelay: 0 });
      const { work: resuming, runs, seen } = resumingWork();
      const clients: unknown[] = [];
      await boss.work<Data>(
        name,
        work,
        idempotentWorker(
          async (_job: Job, { db: client }) => {
            clients.push(client);
            return resuming();
          },
          { boss, store: storeOf(), transactional: true },
        ),
      );
      const job = await settledJob(
        boss,
        name,
        await send(name, { idempotencyKey: `steps-tx-${name}`, n: 1 }),
      );
      expect([job.state, job.retryCount, job.output]).toEqual(['completed', 1, { a: { n: 2 } }]);
      expect(runs).toEqual({ deliveries: 2, a: 2, b: 1 });
      expect(seen.map((s) => s.a)).toEqual([{ n: 1 }, { n: 2 }]);
      expect(seen[1]?.keyFor).toBe(seen[0]?.keyFor);
      expect(clients).toHaveLength(2);
      expect(seen.every((s, i) => s.db === clients[i] && s.db !== undefined)).toBe(true);
      await boss.offWork(name);
    },
  );
});

describe('option mistakes are caught at construction', () => {
  const fn = async () => null;
  const cases: Array<[string, () => unknown]> = [
    ['boss', () => idempotentWorker(fn, {} as never)],
    ['boss', () => idempotentWorker(fn, { boss: {} as never })],
    ['maxAttempts', () => idempotentWorker(fn, { boss, maxAttempts: 3 } as never)],
    ['retryDelay', () => idempotentWorker(fn, { boss, retryDelay: '1s' } as never)],
    ['store', () => idempotentWorker(fn, { boss, transactional: true, store: new MemoryStore() } as never)],
    ['store', () => idempotentWorker(fn, { boss, transactional: true } as never)],
    [
      'lockTimeout',
      () => idempotentWorker(fn, { boss, store, transactional: true, lockTimeout: '5s' } as never),
    ],
    [
      'inProgress',
      () => idempotentWorker(fn, { boss, store, transactional: true, inProgress: 'reject' } as never),
    ],
    [
      'onMissingKey',
      () => idempotentWorker(fn, { boss, store, transactional: true, onMissingKey: 'process' }),
    ],
    ['transactional', () => idempotentWorker(fn, { boss, store, transactional: 'yes' } as never)],
    ['key', () => idempotentWorker(fn, { boss, key: 'idempotencyKey' } as never)],
    ['queue', () => idempotentWorker(fn, { boss, queue: 'orders' } as never)],
    ['ttl', () => idempotentWorker(fn, { boss, ttl: 'forever' as never })],
    ['inProgress', () => idempotentWorker(fn, { boss, inProgress: { wait: 'soon' as never } })],
    ['inProgress', () => idempotentWorker(fn, { boss, inProgress: 'wait' as never })],
    ['options', () => idempotentWorker(fn, null as never)],
    ['handler', () => idempotentWorker(null as never, { boss })],
  ];
  test.each(cases)('%s', (option, make) => {
    let thrown: unknown;
    try {
      make();
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(IdempotencyOptionsError);
    expect((thrown as IdempotencyOptionsError).message).toContain(option);
  });
});
