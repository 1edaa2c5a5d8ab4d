/**
 * @services postgres-server
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { idempotency } from '@oncely/express';
import { type PrivatePostgres, startPostgres } from '@oncely/testing';
import express from 'express';
import pg from 'pg';
import postgres, { type Sql, type TransactionSql } from 'postgres';
import request from 'supertest';
import { PostgresStore, transactionSql } from '../src';

// A paused server (SIGSTOP on the postmaster and its backends) under a PostgresStore on postgres.js, which has no
// client-side query timeout of its own: with the store's `queryTimeout`, covered requests get 503 and the handler does
// not run; without it, a covered request waits for the server. Each key still runs once after the resume.
jest.setTimeout(60_000);

const QUERY_TIMEOUT = 1000;
/** How long a request without queryTimeout is watched during a pause before the server is resumed. */
const DEFAULTS_WATCH = 4000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error(`not within 20 s: ${what}`);
}

let server: PrivatePostgres;
const clients: Sql[] = [];
const servers: Server[] = [];
/** Handler runs per key. */
const runs = new Map<string, number>();
let check: pg.Pool;

/** A handler that waits, after its insert, until the test lets it answer. */
type Gate = { wait: Promise<void>; open: () => void; entered: Promise<void>; enter: () => void };
const gates = new Map<string, Gate>();
function gate(key: string): Gate {
  const g = {} as Gate;
  g.wait = new Promise<void>((resolve) => {
    g.open = resolve;
  });
  g.entered = new Promise<void>((resolve) => {
    g.enter = resolve;
  });
  gates.set(key, g);
  return g;
}
const rows = async (key: string): Promise<number> =>
  (await check.query('SELECT count(*)::int AS n FROM charges WHERE key = $1', [key])).rows[0].n;

function postgresJs(): Sql {
  const sql = postgres(server.url, { max: 4, connect_timeout: 1, onnotice: () => {} });
  clients.push(sql);
  return sql;
}

async function serve(app: express.Express): Promise<string> {
  const listening = app.listen(0, '127.0.0.1');
  servers.push(listening);
  await new Promise((resolve) => listening.once('listening', resolve));
  return `http://127.0.0.1:${(listening.address() as AddressInfo).port}`;
}

async function app(store: PostgresStore<TransactionSql>, transactional: boolean): Promise<string> {
  const a = express();
  a.use(express.json());
  a.use(idempotency({ store, transactional, lockTimeout: 30_000 }));
  a.post('/charges', async (req, res, next) => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    try {
      if (transactional) await transactionSql(req)`INSERT INTO charges (key) VALUES (${key})`;
      const gate = gates.get(key);
      gate?.enter();
      await gate?.wait;
      res.status(Number(req.body?.status ?? 201)).json({ ok: true });
    } catch (error) {
      next(error);
    }
  });
  return serve(a);
}

const post = (url: string, key: string, status = 201) =>
  request(url).post('/charges').set('Idempotency-Key', key).send({ amount: 1, status });

/** Every answer of `key` until it is served: 409s while a statement left behind holds it, then 201. */
async function servedAfterResume(url: string, key: string): Promise<number[]> {
  const answers: number[] = [];
  await until(async () => {
    const { status } = await post(url, key);
    answers.push(status);
    return status === 201;
  }, `${key} served`);
  return answers;
}

let plain: string;
let transactional: string;
let unbounded: string;

beforeAll(async () => {
  server = await startPostgres();
  check = new pg.Pool({
    host: '127.0.0.1',
    port: server.port,
    user: 'postgres',
    database: 'postgres',
    max: 2,
    connectionTimeoutMillis: 1000,
  });
  const sql = postgresJs();
  const store = new PostgresStore({ sql, queryTimeout: QUERY_TIMEOUT });
  await store.migrate();
  await sql`CREATE TABLE charges (id serial PRIMARY KEY, key text NOT NULL)`;
  plain = await app(store, false);
  transactional = await app(
    new PostgresStore({ sql: postgresJs(), queryTimeout: `${QUERY_TIMEOUT}ms` }),
    true,
  );
  unbounded = await app(new PostgresStore({ sql: postgresJs() }), false);
});

afterAll(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
  server?.resume();
  await Promise.all(clients.map((sql) => sql.end({ timeout: 1 }).catch(() => {})));
  await check?.end().catch(() => {});
  await server?.stop();
});

function expect503(res: request.Response): void {
  expect(res.status).toBe(503);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(res.body.status).toBe(503);
}

test.each([
  ['plain mode', () => plain, 'p'],
  ['transactional mode', () => transactional, 't'],
])(
  '%s with queryTimeout: 503 while paused, no hang, the handler does not run; each key runs once after the resume',
  async (_mode, url, prefix) => {
    // Warm: each postgres.js client has an open connection, so one request meets a silent backend, the other a
    // postmaster that does not answer its startup.
    await until(async () => (await post(url(), `${prefix}0`)).status === 201, 'served before the pause');
    server.pause();
    let elapsed: number;
    try {
      const started = Date.now();
      const down = await Promise.all([post(url(), `${prefix}1`), post(url(), `${prefix}2`)]);
      elapsed = Date.now() - started;
      for (const res of down) expect503(res);
      expect(elapsed).toBeGreaterThanOrEqual(QUERY_TIMEOUT - 50);
      expect(elapsed).toBeLessThan(10_000); // generous: without the bound, they wait for the resume
      expect(runs.get(`${prefix}1`)).toBeUndefined();
      expect(runs.get(`${prefix}2`)).toBeUndefined();
    } finally {
      server.resume();
    }
    const seen: string[] = [];
    for (const key of [`${prefix}1`, `${prefix}2`]) {
      const answers = await servedAfterResume(url(), key);
      seen.push(`${key}: ${answers.join(' ')}`);
      // A statement left behind may hold the key for a moment (409), never a 5xx; then it runs, once.
      expect(answers.slice(0, -1).every((status) => status === 409)).toBe(true);
      expect((await post(url(), key)).headers['idempotent-replayed']).toBe('true');
      expect(runs.get(key)).toBe(1);
      if (prefix === 't') expect(await rows(key)).toBe(1);
    }
    console.log(
      `${_mode}, paused: 2 requests answered 503 in ${elapsed} ms; after the resume: ${seen.join(', ')}`,
    );
  },
);

test('transactional mode: the completion statement times out inside the transaction; the request gets 500, nothing is kept, and the retry after the resume runs once more', async () => {
  const g = gate('t-inflight');
  const inflight = post(transactional, 't-inflight').then((r) => r); // supertest sends on then()
  await g.entered; // the handler's insert is in the open transaction
  server.pause();
  let res: request.Response;
  try {
    g.open(); // the handler answers: the store's completion statement meets the paused server
    res = await inflight;
  } finally {
    server.resume();
  }
  expect(res.status).toBe(500);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  // Rolled back, whenever the server got to it: the insert is not there, and the key runs again.
  const answers = await servedAfterResume(transactional, 't-inflight');
  expect(answers.slice(0, -1).every((status) => status === 409)).toBe(true);
  expect(runs.get('t-inflight')).toBe(2);
  expect(await rows('t-inflight')).toBe(1);
  expect((await post(transactional, 't-inflight')).headers['idempotent-replayed']).toBe('true');
});

test('transactional mode: a handler answering 502 while the server is paused gets its answer within queryTimeout (the ROLLBACK is bounded); nothing kept, the retry runs again', async () => {
  const g = gate('t-rollback');
  const inflight = post(transactional, 't-rollback', 502).then((r) => r); // supertest sends on then()
  await g.entered;
  server.pause();
  let res: request.Response;
  try {
    g.open(); // a 5xx is not stored: the transaction rolls back, on a server that does not answer
    res = await inflight;
  } finally {
    server.resume();
  }
  expect(res.status).toBe(502);
  const answers = await servedAfterResume(transactional, 't-rollback');
  expect(answers.slice(0, -1).every((status) => status === 409)).toBe(true);
  expect(runs.get('t-rollback')).toBe(2);
  expect(await rows('t-rollback')).toBe(1);
});

test(`without queryTimeout: a covered request is still waiting after ${DEFAULTS_WATCH / 1000} s of pause, and is answered once the server resumes`, async () => {
  await until(async () => (await post(unbounded, 'u0')).status === 201, 'served before the pause');
  server.pause();
  let settled = false;
  const pending = post(unbounded, 'u1').then((res) => {
    settled = true;
    return res;
  });
  try {
    await sleep(DEFAULTS_WATCH);
    expect(settled).toBe(false);
  } finally {
    server.resume();
  }
  expect((await pending).status).toBe(201);
  expect(runs.get('u1')).toBe(1);
});

test('queryTimeout is checked at construction, naming the option', () => {
  const sql = postgres('postgres://127.0.0.1:1/none', { max: 1 });
  clients.push(sql);
  expect(() => new PostgresStore({ sql, queryTimeout: 0 })).toThrow(/queryTimeout.*from 1 ms to 24 days/);
  expect(() => new PostgresStore({ sql, queryTimeout: '30d' })).toThrow(/queryTimeout.*"30d"/);
  expect(() => new PostgresStore({ sql, queryTimeout: 'soon' as unknown as number })).toThrow(
    /queryTimeout.*"soon"/,
  );
  const pool = new pg.Pool({ host: '127.0.0.1', port: 1 });
  const withPool = () =>
    // @ts-expect-error queryTimeout is for postgres.js
    new PostgresStore({ pool, queryTimeout: 1000 });
  expect(withPool).toThrow(/queryTimeout.*query_timeout on the Pool/);
  void pool.end();
});
