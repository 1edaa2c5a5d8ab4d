/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { type AppProcess, fireAtOnce, startAppProcess } from '@oncely/testing';
import Redis from 'ioredis';

// 4 app processes (2 Express, 2 Fastify) behind one Redis; 2,000 requests over 200 keys, all fired at once.
jest.setTimeout(120_000);

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-mp:${randomUUID()}:`;
let apps: AppProcess[] = [];
let redis: Redis;

beforeAll(async () => {
  redis = new Redis(url);
  const script = join(__dirname, 'fixtures', 'app.ts');
  apps = await Promise.all(
    ['express', 'fastify', 'express', 'fastify'].map((framework) =>
      startAppProcess(script, { FRAMEWORK: framework, REDIS_URL: url, PREFIX: prefix }),
    ),
  );
});
afterAll(async () => {
  await Promise.all(apps.map((app) => app.kill()));
  const keys = await redis.keys(`${prefix}*`);
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
});

test('exactly one execution per key; every other answer is a replay or a 409', async () => {
  const keys = Array.from({ length: 200 }, (_, i) => `mp-${i}-${randomUUID()}`);
  const results = await fireAtOnce({ urls: apps.map((a) => a.url), path: '/charges', keys, total: 2000 });

  const executions = await Promise.all(keys.map((key) => redis.get(`${prefix}exec:${key}`)));
  expect(executions.filter((n) => n !== '1')).toEqual([]);

  const originals = results.filter((r) => r.status === 201 && !r.replayed);
  const replays = results.filter((r) => r.status === 201 && r.replayed);
  const conflicts = results.filter((r) => r.status === 409);
  expect(originals).toHaveLength(200);
  expect(new Set(originals.map((r) => r.key)).size).toBe(200);
  expect(originals.length + replays.length + conflicts.length).toBe(2000);
  // A replay carries the original's body, whichever process ran it.
  const bodyOf = new Map(originals.map((r) => [r.key, r.body]));
  for (const r of replays) expect(r.body).toBe(bodyOf.get(r.key));
  // Executions came from more than one process, so the duplicates really raced across processes. Which
  // processes win is the scheduler's choice: on a loaded machine one can lose every race.
  const pids = new Set(originals.map((r) => (JSON.parse(r.body) as { pid: number }).pid));
  expect(pids.size).toBeGreaterThanOrEqual(2);
  console.log(
    `multi-process: ${originals.length} executions, ${replays.length} replays, ${conflicts.length} conflicts`,
  );
});
