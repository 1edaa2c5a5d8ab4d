/**
 * @services postgres
 */
import { join } from 'node:path';
import { IdempotencyInProgressError } from '@oncely/core';
import { startAppProcess, transactionalSuite } from '@oncely/testing';
import type { TransactionSql } from 'postgres';
import request from 'supertest';
import { PostgresStore, transactionSql } from '../src';
import { connectionString, postgresJs, testSchema } from './helpers';

jest.setTimeout(60_000);

const db = testSchema();
const sql = postgresJs();
let store: PostgresStore<TransactionSql>;

beforeAll(async () => {
  store = new PostgresStore({ sql, schema: db.schema });
  await store.migrate();
  await sql.unsafe(`CREATE TABLE "${db.schema}".charges (id serial PRIMARY KEY, key text NOT NULL, pid int)`);
  // A constraint checked only at COMMIT: lets a test make the commit itself fail.
  await sql.unsafe(
    `CREATE TABLE "${db.schema}".deferred (v int, CONSTRAINT once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`,
  );
  await sql.unsafe(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
});
afterAll(async () => {
  await sql.end();
  await db.drop();
});

transactionalSuite<TransactionSql>({
  name: 'PostgresStore on postgres.js (sql.begin)',
  commitFailure: 'a deferred constraint',
  target: () => ({
    store,
    transactionOf: (req) => transactionSql(req),
    charge: (tx, key) => tx`INSERT INTO ${tx(db.schema)}.charges (key) VALUES (${key})`,
    chargeOutside: (key) => sql`INSERT INTO ${sql(db.schema)}.charges (key) VALUES (${key})`,
    count: (key) => count(key),
    breakCommit: async (tx) => {
      await tx.unsafe(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
    },
    recordState: async (key) =>
      (await sql`SELECT state FROM ${sql(db.schema)}.oncely_idempotency WHERE key = ${key}`)[0]?.state as
        | string
        | undefined,
  }),
});

const count = async (key: string) =>
  (await sql`SELECT 1 FROM ${sql(db.schema)}.charges WHERE key = ${key}`).count;

test('a process SIGKILLed between the handler’s insert and the commit leaves no row; the retry runs once', async () => {
  const script = join(__dirname, 'fixtures', 'app.ts');
  const env = {
    DATABASE_URL: connectionString,
    SCHEMA: db.schema,
    MODE: 'transactional',
    DRIVER: 'postgres-js',
  };
  const key = 'killed';
  const doomed = await startAppProcess(script, { ...env, HANG: '1' });
  const pending = request(doomed.url)
    .post('/charges')
    .set('Idempotency-Key', key)
    .send({})
    .then(
      () => 'answered',
      () => 'connection lost',
    );
  await doomed.waitForLine((line) => line === `inserted ${key}`);
  await doomed.kill();
  expect(await pending).toBe('connection lost');
  expect(await count(key)).toBe(0);
  const survivor = await startAppProcess(script, env);
  try {
    // Until PostgreSQL has noticed the dead connection, its advisory lock still says "in progress".
    let retry = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
    for (let i = 0; i < 50 && retry.status === 409; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      retry = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
    }
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    const again = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(await count(key)).toBe(1);
  } finally {
    await survivor.kill();
  }
});

test('500 concurrent deliveries over 100 keys insert exactly 100 rows', async () => {
  const keys = Array.from({ length: 500 }, (_, i) => `many-${i % 100}`);
  const outcomes = await Promise.all(
    keys.map((key) =>
      store
        .transaction(key, {}, async (tx) => {
          await tx`INSERT INTO ${tx(db.schema)}.charges (key) VALUES (${key})`;
          return key;
        })
        .then(
          (r) => r.outcome,
          (error: unknown) => (error instanceof IdempotencyInProgressError ? 'in-progress' : String(error)),
        ),
    ),
  );
  expect(outcomes.filter((o) => o === 'executed')).toHaveLength(100);
  expect(outcomes.every((o) => ['executed', 'replayed', 'in-progress'].includes(o))).toBe(true);
  const [row] =
    await sql`SELECT count(*)::int AS n, count(DISTINCT key)::int AS d FROM ${sql(db.schema)}.charges
    WHERE key LIKE 'many-%'`;
  expect(row).toEqual({ n: 100, d: 100 });
});
