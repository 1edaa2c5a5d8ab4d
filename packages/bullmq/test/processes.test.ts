/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { type ConsumerProcess, startConsumerProcess, waitUntil } from '@oncely/testing';
import { type Job, type JobsOptions, Queue } from 'bullmq';
import Redis from 'ioredis';
import type { OrderData } from './fixtures/processor';

// Competing BullMQ workers in separate processes, sharing a RedisStore, against the Redis on this machine. The
// workers record attempts, side effects and settlements in Redis; everything (BullMQ's keys, the store's, the
// counters) lives under oncely-bullmq-ptest-<run>, obliterated and deleted in afterAll.
jest.setTimeout(120_000);

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const bullPrefix = `oncely-bullmq-ptest-${run}`;
const script = join(__dirname, 'fixtures', 'worker.ts');

let redis: Redis;
const processes: ConsumerProcess[] = [];
const queues: Queue[] = [];

beforeAll(() => {
  redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
});
afterAll(async () => {
  await Promise.all(processes.map(stop));
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

interface Setup {
  queue: Queue<OrderData>;
  prefix: string;
  env: Record<string, string>;
}

function setUp(label: string): Setup {
  const name = `${label}-${randomUUID().slice(0, 6)}`;
  const queue = new Queue<OrderData>(name, { connection: redis, prefix: bullPrefix });
  queues.push(queue);
  const prefix = `${bullPrefix}:counters:${label}:`;
  return {
    queue,
    prefix,
    env: { QUEUE: name, PREFIX: prefix, BULL_PREFIX: bullPrefix, REDIS_URL: redisUrl },
  };
}

async function spawnWorker(env: Record<string, string>): Promise<ConsumerProcess> {
  const p = await startConsumerProcess(script, env);
  processes.push(p);
  return p;
}

/** SIGTERM: the worker closes and ends its sandbox children; SIGKILL if it has not exited within 10s. */
async function stop(p: ConsumerProcess): Promise<void> {
  const { child } = p;
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([exited, new Promise((resolve) => (timer = setTimeout(resolve, 10_000)))]);
  clearTimeout(timer);
  await p.kill();
}

async function addAll(queue: Queue<OrderData>, jobs: OrderData[], opts: JobsOptions = {}): Promise<void> {
  for (let i = 0; i < jobs.length; i += 200) {
    await queue.addBulk(jobs.slice(i, i + 200).map((data) => ({ name: 'charge', data, opts })));
  }
}

const sumOf = (hash: Record<string, string>, ...fields: string[]) =>
  fields.reduce((sum, f) => sum + Number(hash[f] ?? 0), 0);

/** Every job's return value, grouped by key: duplicates must all carry the one stored value. */
function returnValuesByKey(jobs: Job<OrderData>[]): Map<string, string[]> {
  const byKey = new Map<string, string[]>();
  for (const job of jobs) {
    const list = byKey.get(job.data.key) ?? [];
    list.push(JSON.stringify(job.returnvalue));
    byKey.set(job.data.key, list);
  }
  return byKey;
}

test('1,000 jobs, 20% added twice under other job ids, 3 worker processes: every side effect exactly once', async () => {
  const { queue, prefix, env } = setUp('competing');
  const workers = await Promise.all([1, 2, 3].map(() => spawnWorker({ ...env, CONCURRENCY: '10' })));
  const keys = Array.from({ length: 1000 }, (_, i) => `order-${i}`);
  const jobs: OrderData[] = [];
  // 100 duplicates right behind their original (they race it: the in-progress path) and 100 at the end (replays).
  for (let i = 0; i < keys.length; i++) {
    jobs.push({ key: keys[i] as string, order: i });
    if (i % 10 === 0) jobs.push({ key: keys[i] as string, order: i });
  }
  for (let i = 5; i < keys.length; i += 10) jobs.push({ key: keys[i] as string, order: i });
  const started = Date.now();
  await addAll(queue, jobs, { attempts: 3 });

  await waitUntil(
    async () => (await queue.getJobCounts('completed', 'failed')).completed === 1200,
    'all 1,200 jobs completed',
    90_000,
  );
  const elapsed = Date.now() - started;
  const counts = await queue.getJobCounts('completed', 'failed', 'active', 'wait', 'delayed');
  expect(counts).toEqual({ completed: 1200, failed: 0, active: 0, wait: 0, delayed: 0 });

  const effects = await redis.hgetall(`${prefix}effects`);
  expect(Object.keys(effects).sort()).toEqual([...keys].sort());
  expect(Object.entries(effects).filter(([, n]) => n !== '1')).toEqual([]);

  const settled = await redis.hgetall(`${prefix}settled`);
  expect(sumOf(settled, 'ack:executed')).toBe(1000);
  expect(sumOf(settled, 'ack:replayed')).toBe(200);
  expect(Object.keys(settled).filter((k) => k.startsWith('dead-letter') || k.startsWith('retry'))).toEqual(
    [],
  );
  // Every job with a key completed with the one return value its first run stored.
  const completed = await queue.getJobs(['completed'], 0, -1);
  expect(completed).toHaveLength(1200);
  const byKey = returnValuesByKey(completed);
  expect(byKey.size).toBe(1000);
  const pids = new Set(workers.map((w) => w.pid));
  for (const [key, values] of byKey) {
    expect(new Set(values).size).toBe(1);
    const value = JSON.parse(values[0] as string) as { order: number; by: number };
    expect(`order-${value.order}`).toBe(key);
    expect(pids.has(value.by)).toBe(true);
  }
  expect([...byKey.values()].filter((v) => v.length === 2)).toHaveLength(200);
  // All three processes did real work.
  const executors = await redis.hgetall(`${prefix}executors`);
  expect(Object.keys(executors).sort()).toEqual([...pids].map(String).sort());
  console.log(
    `bullmq competing: 1,200 jobs in ${elapsed}ms; settled ${JSON.stringify(settled)}; executions per process ${JSON.stringify(executors)}`,
  );
});

test('sandboxed processor files: duplicates replay, an in-progress duplicate is delayed, a permanent error fails', async () => {
  const { queue, prefix, env } = setUp('sandboxed');
  const sandboxWorkers = await Promise.all(
    [1, 2].map(() => spawnWorker({ ...env, SANDBOX: '1', CONCURRENCY: '2' })),
  );
  const slow = await queue.add('charge', { key: 'slow', order: 1, holdUntil: 'release-slow' });
  await waitUntil(
    async () => (await redis.hget(`${prefix}attempts`, 'slow')) === '1',
    'the slow job to start',
  );
  const slowDuplicate = await queue.add('charge', { key: 'slow', order: 1, holdUntil: 'release-slow' });
  const refused = await queue.add('charge', { key: 'refused', order: 2, permanent: true }, { attempts: 3 });
  const plain = await queue.add('charge', { key: 'plain', order: 3 });

  // A sandbox child takes a while to start (tsx here), longer still on a loaded machine: the first job runs until
  // the duplicate has found its key in progress and been moved back to delayed, however long that takes.
  let seenDelayed = false;
  await waitUntil(
    async () => {
      seenDelayed ||= (await queue.getJobState(slowDuplicate.id as string)) === 'delayed';
      return seenDelayed && Number(await redis.hget(`${prefix}settled`, 'delay:in-progress')) >= 1;
    },
    'the duplicate to be delayed while the first runs',
    60_000,
  );
  await redis.set(`${prefix}release-slow`, '1');
  await waitUntil(
    async () => (await queue.getJobCounts('completed')).completed === 3,
    'slow, its duplicate and plain to complete',
    30_000,
  );
  const refusedDuplicate = await queue.add(
    'charge',
    { key: 'refused', order: 2, permanent: true },
    { attempts: 3 },
  );
  const plainDuplicate = await queue.add('charge', { key: 'plain', order: 3 });
  await waitUntil(
    async () => {
      const c = await queue.getJobCounts('completed', 'failed');
      return c.completed === 4 && c.failed === 2;
    },
    'all six jobs settled',
    30_000,
  );
  const get = async (id: string | undefined) => (await queue.getJob(id as string)) as Job<OrderData>;
  const [s1, s2, r1, r2, p1, p2] = await Promise.all(
    [slow, slowDuplicate, refused, refusedDuplicate, plain, plainDuplicate].map((j) => get(j.id)),
  );
  expect(s2?.returnvalue).toEqual(s1?.returnvalue);
  expect(s1?.returnvalue).toMatchObject({ order: 1, jobId: slow.id });
  expect(p2?.returnvalue).toEqual(p1?.returnvalue);
  expect(s2?.attemptsMade).toBe(1); // only the completing attempt: the delays counted none
  expect([r1?.failedReason, r2?.failedReason]).toEqual(['refused refused', 'refused refused']);
  expect([r1?.attemptsMade, r2?.attemptsMade]).toEqual([1, 1]); // no retries despite attempts: 3
  const effects = await redis.hgetall(`${prefix}effects`);
  expect(effects).toEqual({ slow: '1', refused: '1', plain: '1' });
  const settled = await redis.hgetall(`${prefix}settled`);
  expect(sumOf(settled, 'delay:in-progress')).toBeGreaterThanOrEqual(1);
  expect(settled).toMatchObject({ 'ack:executed': '2', 'ack:replayed': '2', 'dead-letter:permanent': '2' });
  // The processor ran in the sandbox children, not in the worker processes.
  const executors = Object.keys(await redis.hgetall(`${prefix}executors`)).map(Number);
  expect(executors.length).toBeGreaterThan(0);
  for (const pid of executors) expect(processes.map((p) => p.pid)).not.toContain(pid);
  await Promise.all(sandboxWorkers.map(stop));
  for (const pid of executors) expect(() => process.kill(pid, 0)).toThrow(); // the children are gone
});

/** Two workers with short BullMQ locks, so the stalled-job check recovers a killed worker's job within seconds. */
function killEnv(env: Record<string, string>): Record<string, string> {
  return {
    ...env,
    CONCURRENCY: '1',
    LOCK_DURATION: '2000',
    STALLED_INTERVAL: '1000',
    LOCK_TIMEOUT: '1500ms',
  };
}

test('a worker SIGKILLed mid-job, before its side effect: BullMQ recovers the stalled job, the effect happens once', async () => {
  const { queue, prefix, env } = setUp('sigkill-before');
  const a = await spawnWorker({ ...killEnv(env), HANG_KEY: 'victim' });
  const keys = Array.from({ length: 20 }, (_, i) => (i === 4 ? 'victim' : `m-${i}`));
  await addAll(
    queue,
    keys.map((key, order) => ({ key, order })),
  );
  await waitUntil(
    async () => (await redis.get(`${prefix}hanging`)) === `${a.pid} before`,
    'A to hang on victim',
  );
  const b = await spawnWorker(killEnv(env));
  const killedAt = Date.now();
  await a.kill(); // no completion, no failure, no release: BullMQ's lock and oncely's lease must run out
  await waitUntil(
    async () => (await queue.getJobCounts('completed')).completed === 20,
    'all 20 jobs completed',
    30_000,
  );
  const recoveredMs = Date.now() - killedAt;
  const effects = await redis.hgetall(`${prefix}effects`);
  expect(Object.keys(effects).sort()).toEqual([...keys].sort()); // nothing lost
  expect(Object.entries(effects).filter(([, n]) => n !== '1')).toEqual([]); // nothing twice
  expect(await redis.hget(`${prefix}attempts`, 'victim')).toBe('2'); // started by A, finished by B
  const [victim] = (await queue.getJobs(['completed'], 0, -1)).filter((j) => j.data.key === 'victim');
  expect(victim?.stalledCounter).toBe(1); // recovered by BullMQ's stalled-job check
  expect(victim?.returnvalue).toMatchObject({ by: b.pid });
  expect((await queue.getJobCounts('failed')).failed).toBe(0);
  expect(recoveredMs).toBeLessThan(20_000);
  console.log(`bullmq sigkill: victim completed ${recoveredMs}ms after the kill`);
});

test('a worker SIGKILLed after its side effect and before completion: the side effect runs again (the documented gap)', async () => {
  const { queue, prefix, env } = setUp('sigkill-after');
  const a = await spawnWorker({ ...killEnv(env), HANG_AFTER_KEY: 'victim' });
  await addAll(queue, [
    { key: 'm-0', order: 0 },
    { key: 'victim', order: 1 },
    { key: 'm-2', order: 2 },
  ]);
  await waitUntil(
    async () => (await redis.get(`${prefix}hanging`)) === `${a.pid} after`,
    'A to hang on victim',
  );
  expect(await redis.hget(`${prefix}effects`, 'victim')).toBe('1');
  const b = await spawnWorker(killEnv(env));
  await a.kill();
  await waitUntil(
    async () => (await queue.getJobCounts('completed')).completed === 3,
    'all 3 jobs completed',
    30_000,
  );
  // oncely's record was never completed, so once A's lease lapsed the recovered job ran again: a side effect in
  // another system cannot be made once by a wrapper (docs/consumers.md, "Crashes").
  expect(await redis.hgetall(`${prefix}effects`)).toEqual({ 'm-0': '1', victim: '2', 'm-2': '1' });
  const [victim] = (await queue.getJobs(['completed'], 0, -1)).filter((j) => j.data.key === 'victim');
  expect(victim?.returnvalue).toMatchObject({ by: b.pid });
});
