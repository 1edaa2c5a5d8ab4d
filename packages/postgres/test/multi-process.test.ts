/**
 * @services postgres
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { type AppProcess, fireAtOnce, startAppProcess } from '@oncely/testing';
import { PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

// 4 app processes (2 Express, 2 Fastify) on one PostgreSQL; 2,000 requests over 200 keys, all fired at once.
jest.setTimeout(120_000);

const db = testSchema();

beforeAll(async () => {
  await new PostgresStore({ pool: db.pool(), schema: db.schema }).migrate();
  await db
    .pool()
    .query(`CREATE TABLE "${db.schema}".charges (id serial PRIMARY KEY, key text NOT NULL, pid int)`);
});
afterAll(() => db.drop());

describe.each(['plain', 'transactional'])('%s mode', (mode) => {
  let apps: AppProcess[] = [];
  beforeAll(async () => {
    const script = join(__dirname, 'fixtures', 'app.ts');
    apps = await Promise.all(
      ['express', 'fastify', 'express', 'fastify'].map((framework) =>
        startAppProcess(script, {
          FRAMEWORK: framework,
          DATABASE_URL: connectionString,
          SCHEMA: db.schema,
          MODE: mode,
        }),
      ),
    );
  });
  afterAll(async () => {
    await Promise.all(apps.map((app) => app.kill()));
  });

  test('exactly one execution per key; every other answer is a replay or a 409', async () => {
    const keys = Array.from({ length: 200 }, (_, i) => `${mode}-${i}-${randomUUID()}`);
    const results = await fireAtOnce({
      urls: apps.map((a) => a.url),
      path: '/charges',
      keys,
      total: 2000,
      maxSockets: 16,
    });
    const { rows } = await db
      .pool()
      .query(
        `SELECT key, count(*)::int AS n, count(DISTINCT pid)::int AS pids FROM "${db.schema}".charges WHERE key = ANY($1) GROUP BY key`,
        [keys],
      );
    expect(rows).toHaveLength(200);
    expect(rows.filter((r) => r.n !== 1)).toEqual([]);

    const originals = results.filter((r) => r.status === 201 && !r.replayed);
    const replays = results.filter((r) => r.status === 201 && r.replayed);
    const conflicts = results.filter((r) => r.status === 409);
    expect(originals).toHaveLength(200);
    expect(originals.length + replays.length + conflicts.length).toBe(2000);
    const bodyOf = new Map(originals.map((r) => [r.key, r.body]));
    for (const r of replays) expect(r.body).toBe(bodyOf.get(r.key));
    // Executions came from more than one process, so the duplicates really raced across processes. Which
    // processes win is the scheduler's choice: on a loaded machine one can lose every race.
    const pids = new Set(originals.map((r) => (JSON.parse(r.body) as { pid: number }).pid));
    expect(pids.size).toBeGreaterThanOrEqual(2);
  });
});
