/**
 * @services postgres
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import type { Interface } from 'node:readline';
import { PostgresStore } from '@oncely/postgres';
import {
  type ConsumerProcess,
  type SourceProcess,
  spawnSource,
  startConsumerProcess,
  waitUntil,
} from '@oncely/testing';
import type PgBoss from 'pg-boss';
import { connectionString, settledJob, testDatabase } from './helpers';

// Competing transactional workers in separate processes (test/fixtures/worker.ts), against the PostgreSQL on this
// machine. pg-boss, the store, the shipments (the effect) and the settlements live in schemas of this file's own,
// dropped in afterAll. This file's own pg-boss runs maintenance every second: it is what expires the jobs of
// killed workers.
jest.setTimeout(150_000);

const db = testDatabase();
const script = join(__dirname, 'fixtures', 'worker.ts');
let boss: PgBoss;
const processes: Array<{ kill(): Promise<void> }> = [];

beforeAll(async () => {
  boss = await db.boss();
  await new PostgresStore({ pool: db.pool(), schema: db.schema }).migrate();
  await db.pool().query(`CREATE TABLE "${db.schema}".shipments (key text NOT NULL, pid int NOT NULL)`);
  await db
    .pool()
    .query(
      `CREATE TABLE "${db.schema}".settlements (job_id uuid NOT NULL, key text, outcome text NOT NULL, pid int NOT NULL)`,
    );
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  await db.drop();
});

const envFor = (queue: string) => ({
  DATABASE_URL: connectionString,
  SCHEMA: db.schema,
  BOSS_SCHEMA: db.bossSchema,
  QUEUE: queue,
});

async function startWorker(queue: string, extra: Record<string, string> = {}): Promise<ConsumerProcess> {
  const worker = await startConsumerProcess(script, { ...envFor(queue), ...extra });
  processes.push(worker);
  return worker;
}

/** A worker whose stdout the test reads, for the line it prints before hanging (run like startConsumerProcess). */
async function startDoomedWorker(queue: string, extra: Record<string, string>): Promise<SourceProcess> {
  const worker = spawnSource(script, { ...envFor(queue), ...extra });
  processes.push(worker);
  await nextLine(worker, 'ready');
  return worker;
}

function nextLine(worker: { lines: Interface }, expected: string, timeoutMs = 30_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no line ${expected} within ${timeoutMs}ms`)), timeoutMs);
    const onLine = (line: string) => {
      if (line !== expected) return;
      clearTimeout(timer);
      worker.lines.off('line', onLine);
      resolve();
    };
    worker.lines.on('line', onLine);
  });
}

async function query<R>(sql: string, values: unknown[] = []): Promise<R[]> {
  return (await db.pool().query(sql, values)).rows as R[];
}
const shipmentsOf = (key: string) =>
  query<{ pid: number }>(`SELECT pid FROM "${db.schema}".shipments WHERE key = $1`, [key]);

test('1,000 jobs, 20% sent twice under new job ids, 3 worker processes: every effect exactly once', async () => {
  const queue = `competing-${randomUUID()}`;
  await boss.createQueue(queue, { name: queue, retryLimit: 5, retryDelay: 0, expireInSeconds: 60 });
  const workers = await Promise.all([1, 2, 3].map(() => startWorker(queue)));

  const job = (i: number) => ({ name: queue, data: { idempotencyKey: `order-${i}`, n: i } });
  const jobs: ReturnType<typeof job>[] = [];
  // 100 duplicates right behind their original (they race it: the in-progress path), 100 at the end (replays).
  for (let i = 0; i < 1000; i++) {
    jobs.push(job(i));
    if (i % 10 === 0) jobs.push(job(i));
  }
  for (let i = 5; i < 1000; i += 10) jobs.push(job(i));
  expect(jobs).toHaveLength(1200);
  for (let i = 0; i < jobs.length; i += 200) await boss.insert(jobs.slice(i, i + 200));

  const acks = async () =>
    (
      await query<{ n: number }>(
        `SELECT count(*)::int AS n FROM "${db.schema}".settlements WHERE outcome LIKE 'ack:%'`,
      )
    )[0]?.n ?? 0;
  await waitUntil(async () => (await acks()) >= 1200, 'all 1,200 jobs acked', 120_000);

  const perKey = await query<{ key: string; n: number }>(
    `SELECT key, count(*)::int AS n FROM "${db.schema}".shipments GROUP BY key`,
  );
  expect(perKey).toHaveLength(1000);
  expect(perKey.filter((row) => row.n !== 1)).toEqual([]);

  const outcomes = await query<{ outcome: string; n: number }>(
    `SELECT outcome, count(*)::int AS n FROM "${db.schema}".settlements GROUP BY outcome`,
  );
  const count = (outcome: string) => outcomes.find((o) => o.outcome === outcome)?.n ?? 0;
  expect(count('ack:executed')).toBe(1000);
  expect(count('ack:replayed')).toBe(200);
  expect(outcomes.filter((o) => !o.outcome.startsWith('ack:') && !o.outcome.startsWith('delay:'))).toEqual(
    [],
  );
  // Every job is completed (none left active, failed or cancelled), and every process did real work.
  expect(await boss.getQueueSize(queue, { before: 'completed' })).toBe(0);
  const pids = await query<{ pid: number }>(`SELECT DISTINCT pid FROM "${db.schema}".shipments`);
  expect(pids.map((p) => p.pid).sort()).toEqual(workers.map((w) => w.pid).sort());
  console.log(`pg-boss competing: settlements ${JSON.stringify(outcomes)}`);
  await Promise.all(workers.map((w) => w.kill()));
});

test('killed after its transaction committed, before pg-boss completed the job: expired, rerun as a replay, one effect', async () => {
  const queue = `after-commit-${randomUUID()}`;
  await boss.createQueue(queue, { name: queue, retryLimit: 3, retryDelay: 0, expireInSeconds: 2 });
  const doomed = await startDoomedWorker(queue, { HANG_AFTER_COMMIT: 'victim' });
  const committed = nextLine(doomed, 'committed victim');
  const id = (await boss.send(queue, { idempotencyKey: 'victim', n: 1 })) as string;
  await committed;
  await doomed.kill();

  // The effect is committed, and the job is still active: pg-boss was never told.
  expect(await shipmentsOf('victim')).toEqual([{ pid: doomed.child.pid }]);
  expect((await boss.getJobById(queue, id))?.state).toBe('active');

  const survivor = await startWorker(queue);
  // pg-boss expires the job after expireInSeconds, retries it, and the survivor finds the committed record.
  const job = await settledJob(boss, queue, id, 60_000);
  expect(job.state).toBe('completed');
  expect(job.retryCount).toBe(1);
  expect(job.output).toEqual({ key: 'victim', n: 1, pid: doomed.child.pid }); // the stored result
  expect(await shipmentsOf('victim')).toEqual([{ pid: doomed.child.pid }]);
  await waitUntil(
    async () =>
      (
        await query(
          `SELECT 1 FROM "${db.schema}".settlements WHERE job_id = $1 AND outcome = 'ack:replayed' AND pid = $2`,
          [id, survivor.pid],
        )
      ).length === 1,
    'the survivor to record the replay',
  );
  await survivor.kill();
});

test('killed in the middle of its transaction: rolled back, expired, rerun, one effect', async () => {
  const queue = `mid-transaction-${randomUUID()}`;
  await boss.createQueue(queue, { name: queue, retryLimit: 3, retryDelay: 0, expireInSeconds: 2 });
  const doomed = await startDoomedWorker(queue, { HANG_IN_TRANSACTION: 'victim-2' });
  const inTransaction = nextLine(doomed, 'in-transaction victim-2');
  const id = (await boss.send(queue, { idempotencyKey: 'victim-2', n: 2 })) as string;
  await inTransaction;
  await doomed.kill();

  const survivor = await startWorker(queue);
  const job = await settledJob(boss, queue, id, 60_000);
  expect(job.state).toBe('completed');
  expect(job.retryCount).toBe(1);
  expect(job.output).toEqual({ key: 'victim-2', n: 2, pid: survivor.pid }); // run again, by the survivor
  expect(await shipmentsOf('victim-2')).toEqual([{ pid: survivor.pid }]); // the doomed insert was rolled back
  await survivor.kill();
});
