/**
 * @services postgres
 */
import { randomBytes } from 'node:crypto';
import { bodyParser } from '@koa/bodyparser';
import { PostgresStore, transactionClient } from '@oncely/postgres';
import Koa from 'koa';
import pg from 'pg';
import request from 'supertest';
import { idempotency } from '../src';
import { jsonErrors } from './harness';

// A schema of this file's own, dropped afterwards: tests never touch shared tables.
const schema = `oncely_koa_${randomBytes(6).toString('hex')}`;
const pool = new pg.Pool({
  connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  max: 10,
});
const store = new PostgresStore({ pool, schema });

beforeAll(async () => {
  await store.migrate();
  await pool.query(`CREATE TABLE "${schema}".charges (id serial PRIMARY KEY, key text NOT NULL)`);
  // A constraint checked only at COMMIT: lets a test make the commit itself fail.
  await pool.query(
    `CREATE TABLE "${schema}".deferred (v int, CONSTRAINT once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`,
  );
  await pool.query(`INSERT INTO "${schema}".deferred VALUES (1)`);
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

const rows = async (key: string) =>
  Number((await pool.query(`SELECT count(*) FROM "${schema}".charges WHERE key = $1`, [key])).rows[0].count);

function app(): Koa {
  const koa = new Koa();
  koa.silent = true;
  koa.use(jsonErrors);
  koa.use(bodyParser());
  koa.use(idempotency({ store, transactional: true }));
  koa.use(async (ctx) => {
    const client = transactionClient(ctx.state);
    const body = ctx.request.body as { amount: number; fail?: boolean; breakCommit?: boolean };
    await client.query(`INSERT INTO "${schema}".charges (key) VALUES ($1)`, [ctx.state.idempotencyKey]);
    if (body.fail) throw new Error('handler failed after its write');
    if (body.breakCommit) await client.query(`INSERT INTO "${schema}".deferred VALUES (1)`);
    ctx.status = 201;
    ctx.body = { charged: body.amount };
  });
  return koa;
}

describe('transactional mode on Koa (PostgresStore)', () => {
  test('the business row and the record commit together; the replay comes from the record', async () => {
    const server = request(app().callback());
    const first = await server.post('/').set('Idempotency-Key', 'together').send({ amount: 5 });
    expect(first.status).toBe(201);
    const replay = await server.post('/').set('Idempotency-Key', 'together').send({ amount: 5 });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ charged: 5 });
    expect(await rows('together')).toBe(1);
  });

  test('a handler that fails after writing leaves neither row nor record; the retry runs once', async () => {
    const server = request(app().callback());
    expect(
      (await server.post('/').set('Idempotency-Key', 'fails').send({ amount: 1, fail: true })).status,
    ).toBe(500);
    expect(await rows('fails')).toBe(0);
    expect((await server.post('/').set('Idempotency-Key', 'fails').send({ amount: 1 })).status).toBe(201);
    expect(await rows('fails')).toBe(1);
  });

  test('a commit that fails turns the handler’s 201 into a 500 problem, and nothing is kept', async () => {
    const server = request(app().callback());
    const res = await server
      .post('/')
      .set('Idempotency-Key', 'commit')
      .send({ amount: 1, breakCommit: true });
    expect(res.status).toBe(500);
    expect(res.headers['content-type']).toBe('application/problem+json');
    expect(res.body.charged).toBeUndefined();
    expect(await rows('commit')).toBe(0);
  });
});
