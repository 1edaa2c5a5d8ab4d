/**
 * @services postgres
 */
import { idempotency } from '@oncely/express';
import express from 'express';
import pg from 'pg';
import request from 'supertest';
import { PostgresStore, transactionClient } from '../src';
import { connectionString, testSchema } from './helpers';

// A COMMIT that gets no answer within the pool's query_timeout: a deferred constraint trigger sleeps 1.5 s at COMMIT,
// the client gives up after 0.5 s, and the server commits all the same a second later. The request must not be
// told "nothing was kept": it gets 503 `commit-outcome-unknown`, and the retry replays what was committed.
jest.setTimeout(60_000);

const QUERY_TIMEOUT = 500;
const COMMIT_SLEEP_S = 1.5;

const db = testSchema();
let pool: pg.Pool;
/** Handler runs per key. */
const runs = new Map<string, number>();

beforeAll(async () => {
  pool = new pg.Pool({ connectionString, max: 4, query_timeout: QUERY_TIMEOUT });
  pool.on('error', () => {}); // a destroyed client's late errors are expected here
  await new PostgresStore({ pool: db.pool(), schema: db.schema }).migrate();
  const s = `"${db.schema}"`;
  await db.pool().query(`CREATE TABLE ${s}.charges (key text NOT NULL, slow boolean NOT NULL)`);
  await db.pool().query(
    `CREATE FUNCTION ${s}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN IF NEW.slow THEN PERFORM pg_sleep(${COMMIT_SLEEP_S}); END IF; RETURN NULL; END $$`,
  );
  await db.pool().query(
    `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ${s}.charges DEFERRABLE INITIALLY DEFERRED
       FOR EACH ROW EXECUTE FUNCTION ${s}.slow_commit()`,
  );
});
afterAll(async () => {
  await pool?.end();
  await db.drop();
});

function app(): express.Express {
  const a = express();
  a.use(express.json());
  a.use(idempotency({ store: new PostgresStore({ pool, schema: db.schema }), transactional: true }));
  a.post('/charges', async (req, res, next) => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    try {
      await transactionClient(req).query(`INSERT INTO "${db.schema}".charges (key, slow) VALUES ($1, $2)`, [
        key,
        req.body.slow === true,
      ]);
      res.status(201).json({ key });
    } catch (error) {
      next(error);
    }
  });
  return a;
}

const rows = async (key: string): Promise<number> =>
  Number(
    (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
      .count,
  );

test('a COMMIT without an answer is a 503 commit-outcome-unknown, not "nothing kept"; the retry replays what committed', async () => {
  const a = app();
  const first = await request(a).post('/charges').set('Idempotency-Key', 'slow').send({ slow: true });
  expect(first.status).toBe(503);
  expect(first.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(first.headers['retry-after']).toBe('1');
  expect(first.body).toMatchObject({
    type: 'https://oncely.dev/problems/commit-outcome-unknown',
    status: 503,
  });
  // The server finishes the COMMIT it was given: the row and the record are there once it has.
  for (let i = 0; i < 200 && (await rows('slow')) === 0; i++) await new Promise((r) => setTimeout(r, 50));
  expect(await rows('slow')).toBe(1);
  const retry = await request(a).post('/charges').set('Idempotency-Key', 'slow').send({ slow: true });
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(retry.body).toEqual({ key: 'slow' });
  expect(runs.get('slow')).toBe(1);
  expect(await rows('slow')).toBe(1);
});

test('a COMMIT that answers in time is unaffected, and the pool is usable after a destroyed client', async () => {
  const a = app();
  await request(a).post('/charges').set('Idempotency-Key', 'fast').send({ slow: false }).expect(201);
  const replay = await request(a).post('/charges').set('Idempotency-Key', 'fast').send({ slow: false });
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expect(runs.get('fast')).toBe(1);
  expect(await rows('fast')).toBe(1);
});
