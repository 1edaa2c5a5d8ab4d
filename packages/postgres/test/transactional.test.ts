/**
 * @services postgres
 */
import { join } from 'node:path';
import { startAppProcess, type TransactionalSuiteTarget, transactionalSuite } from '@oncely/testing';
import type { PoolClient } from 'pg';
import request from 'supertest';
import { PostgresStore, transactionClient } from '../src';
import { connectionString, pgSuiteParts, testSchema } from './helpers';

jest.setTimeout(60_000);

const db = testSchema();
let store: PostgresStore;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  store = new PostgresStore({ pool: db.pool(), schema: db.schema });
  await store.migrate();
  await db
    .pool()
    .query(`CREATE TABLE "${db.schema}".charges (id serial PRIMARY KEY, key text NOT NULL, pid int)`);
  // A constraint checked only at COMMIT: lets a test make the commit itself fail.
  await db
    .pool()
    .query(
      `CREATE TABLE "${db.schema}".deferred (v int, CONSTRAINT once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`,
    );
  await db.pool().query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
});
afterAll(() => db.drop());

const target: TransactionalSuiteTarget<PoolClient> = {
  get store() {
    return store;
  },
  transactionOf: (req) => transactionClient(req),
  ...pgSuiteParts(db),
  expectIdle: () => {
    const pool = db.pool();
    expect({ idle: pool.idleCount, waiting: pool.waitingCount }).toEqual({
      idle: pool.totalCount,
      waiting: 0,
    });
  },
};

transactionalSuite({ name: 'PostgresStore', commitFailure: 'a deferred constraint', target: () => target });

describe('a process killed with SIGKILL mid-transaction', () => {
  test.each(['express', 'fastify'])(
    '%s: leaves neither row nor record, and the retry runs exactly once',
    async (framework) => {
      const script = join(__dirname, 'fixtures', 'app.ts');
      const env = {
        DATABASE_URL: connectionString,
        SCHEMA: db.schema,
        MODE: 'transactional',
        FRAMEWORK: framework,
      };
      const key = `killed-${framework}`;
      const doomed = await startAppProcess(script, { ...env, HANG: '1' });
      const pending = request(doomed.url)
        .post('/charges')
        .set('Idempotency-Key', key)
        .send({ amount: 1 })
        .then(
          () => 'answered',
          () => 'connection lost',
        );
      await doomed.waitForLine((line) => line === `inserted ${key}`);
      await doomed.kill();
      expect(await pending).toBe('connection lost');
      // PostgreSQL rolls the dead session back: neither the business row nor the record exists.
      expect(await target.count(key)).toBe(0);
      expect(await target.recordState(key)).toBeUndefined();

      const survivor = await startAppProcess(script, env);
      try {
        // Until PostgreSQL has noticed the dead connection, its advisory lock still says "in progress".
        let retry = await request(survivor.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 1 });
        for (let i = 0; i < 50 && retry.status === 409; i++) {
          await sleep(100);
          retry = await request(survivor.url)
            .post('/charges')
            .set('Idempotency-Key', key)
            .send({ amount: 1 });
        }
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        const again = await request(survivor.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 1 });
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(await target.count(key)).toBe(1);
      } finally {
        await survivor.kill();
      }
    },
  );
});
