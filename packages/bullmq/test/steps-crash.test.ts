/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import {
  type ConsumerProcess,
  type CrashAnswer,
  checkCrashRun,
  killRepeatedly,
  sleep,
  startChargeProvider,
  startConsumerProcess,
  waitUntil,
} from '@oncely/testing';
import { Queue } from 'bullmq';
import Redis from 'ioredis';

// step() in a consumer on real servers: a BullMQ worker process whose processor runs three steps per job through
// currentIdempotency() (an order, a charge at a provider that honours Idempotency-Key, an outbox entry) is
// SIGKILLed at random points while it holds jobs and restarted, again and again; BullMQ's stalled-job check hands
// the killed worker's jobs to the next one. The provider runs in this process; BullMQ's keys, the store's, the
// effects and the journal live under oncely-bullmq-steps-<run>, deleted afterwards.
jest.setTimeout(180_000);

const JOBS = 200;
const KILLS = 5;
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const bullPrefix = `oncely-bullmq-steps-${randomUUID().slice(0, 8)}`;
const script = join(__dirname, 'fixtures', 'steps-worker.ts');

let redis: Redis;
const processes: ConsumerProcess[] = [];
const queues: Queue[] = [];

beforeAll(() => {
  redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  for (const q of queues) {
    await q.obliterate({ force: true });
    await q.close();
  }
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${bullPrefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  await redis.quit();
});

test('200 jobs, three steps each, the worker SIGKILLed repeatedly: each charge once, no recorded step run again', async () => {
  const name = `steps-${randomUUID().slice(0, 6)}`;
  const queue = new Queue<{ key: string }>(name, { connection: redis, prefix: bullPrefix });
  queues.push(queue);
  const prefix = `${bullPrefix}:app:`;
  const provider = await startChargeProvider(30);
  const env = {
    QUEUE: name,
    BULL_PREFIX: bullPrefix,
    PREFIX: prefix,
    REDIS_URL: redisUrl,
    PROVIDER_URL: provider.url,
    STEP_DELAY_MS: '40',
    LOCK_TIMEOUT_MS: '1500',
    CONCURRENCY: '10',
  };
  // Every loop ends by this time, the test passed or not: none outlives it (jest's timeout does not stop them).
  const deadline = Date.now() + 130_000;
  const stopped = () => Date.now() > deadline;
  try {
    const keys = Array.from({ length: JOBS }, (_, i) => `order-${i}`);
    // Attempts to spare: a job whose step found its lease taken over fails that attempt and is retried.
    await queue.addBulk(
      keys.map((key) => ({
        name: 'order',
        data: { key },
        opts: { attempts: 50, backoff: { type: 'fixed', delay: 100 } },
      })),
    );
    let settled = 0;
    const poll = (async () => {
      while (!stopped() && settled < JOBS) {
        const counts = await queue.getJobCounts('completed', 'failed');
        settled = (counts.completed ?? 0) + (counts.failed ?? 0);
        await sleep(100);
      }
    })();
    const started = Date.now();
    const { killed } = await killRepeatedly({
      start: async () => {
        const p = await startConsumerProcess(script, env);
        processes.push(p);
        return p;
      },
      kills: KILLS,
      upMs: [0, 800],
      progress: () => settled,
      done: () => stopped() || settled === JOBS,
    });
    await waitUntil(() => settled === JOBS, `all ${JOBS} jobs settled`, Math.max(1, deadline - Date.now()));
    await poll;
    const elapsed = Date.now() - started;
    const counts = await queue.getJobCounts('completed', 'failed', 'active', 'wait', 'delayed');
    expect(counts).toEqual({ completed: JOBS, failed: 0, active: 0, wait: 0, delayed: 0 });

    const answers = new Map<string, CrashAnswer>();
    for (const job of await queue.getJobs(['completed'], 0, -1))
      answers.set(job.data.key, job.returnvalue as CrashAnswer);
    expect([...answers.keys()].sort()).toEqual([...keys].sort());

    const list = async (suffix: string) =>
      (await redis.lrange(`${prefix}${suffix}`, 0, -1)).map((e) => JSON.parse(e));
    const check = checkCrashRun({
      answers,
      orders: await list('orders'),
      outbox: await list('outbox'),
      journal: await list('journal'),
      provider,
      killed,
    });
    expect({ problems: check.problems, first: check.first }).toEqual({ problems: 0, first: [] });
    // The kills did hit jobs in the middle: later attempts resumed from recorded steps.
    expect(killed.size).toBeGreaterThanOrEqual(3);
    expect(check.replays).toBeGreaterThan(0);
    console.log(`bullmq steps crash: ${JOBS} jobs in ${elapsed}ms; ${check.summary}`);
  } finally {
    await provider.close();
  }
});
