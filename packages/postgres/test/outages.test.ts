/**
 * @services postgres-server
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { idempotency } from '@oncely/express';
import { type PrivatePostgres, startPostgres } from '@oncely/testing';
import express from 'express';
import pg from 'pg';
import request from 'supertest';
import { type CompletedRecordCache, OutboxRelay, PostgresStore, transactionClient } from '../src';

// Outages on a private PostgreSQL server (initdb + postgres from the system binaries, on a free port): killed
// (immediate stop), restarted, paused (SIGSTOP on the postmaster and its backends). The pool is configured as
// docs/stores/postgres.md recommends, with shorter timeouts, so that every outage fails fast; one case measures what
// pg's defaults do instead.
jest.setTimeout(120_000);

const CONNECT_TIMEOUT = 1000;
const STATEMENT_TIMEOUT = 1000;
const QUERY_TIMEOUT = 1500;
/** The default lease: a key left in progress by an orphaned acquire must be freed by the store well before it ends. */
const LOCK_TIMEOUT = 30_000;
/** How long a request with pg's defaults is watched during a pause before the server is resumed. */
const DEFAULTS_WATCH = 8000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error('condition not met in 15s');
}

let server: PrivatePostgres;
const pools: pg.Pool[] = [];
const servers: Server[] = [];
/** Errors the pools emitted (idle clients whose connection died): counted, never thrown. */
const poolErrors: Error[] = [];
/** Handler runs per key, over every app of this file. */
const runs = new Map<string, number>();

/** The private server, by parts (a URL works as well: `server.url`). */
const address = () => ({ host: '127.0.0.1', port: server.port, user: 'postgres', database: 'postgres' });

/** The pool the docs recommend (timeouts shortened for the test). */
function recommendedPool(): pg.Pool {
  const pool = new pg.Pool({
    ...address(),
    max: 10,
    connectionTimeoutMillis: CONNECT_TIMEOUT,
    query_timeout: QUERY_TIMEOUT,
    statement_timeout: STATEMENT_TIMEOUT,
    idle_in_transaction_session_timeout: 10_000,
    keepAlive: true,
  });
  pool.on('error', (error) => poolErrors.push(error));
  pools.push(pool);
  return pool;
}

type Gate = { wait: Promise<void>; open: () => void; entered: Promise<void>; enter: () => void };
function gate(): Gate {
  let open!: () => void;
  let enter!: () => void;
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  const entered = new Promise<void>((resolve) => {
    enter = resolve;
  });
  return { wait, open, entered, enter };
}
const gates = new Map<string, Gate>();

async function serve(app: express.Express): Promise<string> {
  const listening = app.listen(0, '127.0.0.1');
  servers.push(listening);
  await new Promise((resolve) => listening.once('listening', resolve));
  return `http://127.0.0.1:${(listening.address() as AddressInfo).port}`;
}

/** An app in plain mode over `pool`. */
async function plainApp(pool: pg.Pool): Promise<string> {
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: new PostgresStore({ pool }), lockTimeout: LOCK_TIMEOUT }));
  app.post('/charges', (req, res) => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    res.status(201).json({ ok: true });
  });
  return serve(app);
}

/** An app in transactional mode over `pool`: the handler inserts a row through the request's transaction. */
async function transactionalApp(pool: pg.Pool): Promise<string> {
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: new PostgresStore({ pool }), transactional: true }));
  app.post('/charges', async (req, res, next) => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    try {
      await transactionClient(req).query('INSERT INTO charges (key) VALUES ($1)', [key]);
      const g = gates.get(key);
      g?.enter();
      await g?.wait;
      res.status(201).json({ ok: true });
    } catch (error) {
      next(error);
    }
  });
  return serve(app);
}

const post = (url: string, key: string) =>
  request(url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 });

function expect503(res: request.Response): void {
  expect(res.status).toBe(503);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(res.body.status).toBe(503);
}

let plain: string;
let transactional: string;
let check: pg.Pool;

beforeAll(async () => {
  server = await startPostgres();
  const pool = recommendedPool();
  // With the outbox: its table too, for the relay's test.
  await new PostgresStore({ pool, outbox: true }).migrate();
  await pool.query('CREATE TABLE charges (id serial PRIMARY KEY, key text NOT NULL)');
  plain = await plainApp(pool);
  transactional = await transactionalApp(pool);
  check = recommendedPool();
});

afterAll(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
  server?.resume();
  await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
  await server?.stop();
});

describe('plain mode, with the recommended pool settings', () => {
  test('killed: covered requests get 503 problem+json within a few seconds and the handler does not run; restarted: served again, same app and pool', async () => {
    await post(plain, 'before').expect(201);
    await server.kill();
    const started = Date.now();
    const down = await Promise.all(['k1', 'k2', 'k1', 'before'].map((key) => post(plain, key)));
    const elapsed = Date.now() - started;
    for (const res of down) expect503(res);
    // Generous bound: a pool waiting for a connection with no timeout would never answer.
    expect(elapsed).toBeLessThan(5000);
    expect(runs.get('k1')).toBeUndefined();
    expect(runs.get('k2')).toBeUndefined();
    console.log(`killed: 4 covered requests answered 503 in ${elapsed} ms`);

    await server.restart();
    await until(async () => (await post(plain, 'k1')).status === 201);
    const replay = await post(plain, 'k1').expect(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    // The key stored before the outage survived it (the record is in the database, not in the process).
    expect((await post(plain, 'before')).headers['idempotent-replayed']).toBe('true');
    await post(plain, 'k2').expect(201);
    expect(runs.get('k1')).toBe(1);
    expect(runs.get('k2')).toBe(1);
    expect(runs.get('before')).toBe(1);
  });

  test('paused (SIGSTOP on the postmaster and its backends): 503 after the timeouts, no hang; resumed: served again', async () => {
    await until(async () => (await post(plain, 'p0')).status === 201);
    server.pause();
    try {
      const started = Date.now();
      // Two at once: one gets the pool's idle connection (its query times out), one opens a new connection (its
      // startup times out, the postmaster being stopped).
      const down = await Promise.all([post(plain, 'p1'), post(plain, 'p2')]);
      const elapsed = Date.now() - started;
      for (const res of down) expect503(res);
      expect(elapsed).toBeGreaterThanOrEqual(CONNECT_TIMEOUT - 50);
      expect(elapsed).toBeLessThan(10_000);
      expect(runs.get('p1')).toBeUndefined();
      expect(runs.get('p2')).toBeUndefined();
      console.log(`paused: 2 covered requests answered 503 in ${elapsed} ms`);
    } finally {
      server.resume();
    }
    const resumedAt = Date.now();
    await until(async () => (await check.query('SELECT 1')).rowCount === 1);
    // The acquire sent on the pool's idle connection was still in the paused backend's socket: the client gave up
    // (query_timeout) and closed the connection, but on SIGCONT the backend ran it before reading the close, and
    // reserved the key for a lease nobody owns. The store keeps releasing that lease behind the failed acquire
    // (undoAcquire), so such a key answers 409 for a moment, not for the lease's 30 s, then runs once.
    const { rows } = await check.query<{ key: string }>(
      "SELECT key FROM oncely_idempotency WHERE state = 'in_progress' AND (key LIKE '%p1' OR key LIKE '%p2')",
    );
    const held = rows.map((row) => row.key.slice(-2));
    const seen = new Map<string, number[]>();
    for (const key of ['p1', 'p2']) {
      seen.set(key, []);
      await until(async () => {
        const { status } = await post(plain, key);
        seen.get(key)?.push(status);
        return status === 201;
      });
    }
    console.log(
      `paused, after the resume: keys held by an orphaned acquire: [${held}]; answers until served: ${[...seen].map(([key, answers]) => `${key}: ${answers.length - 1} x 409 then ${answers.at(-1)}`).join(', ')}; all served ${Date.now() - resumedAt} ms after the resume (lockTimeout ${LOCK_TIMEOUT} ms)`,
    );
    // Generous, yet far below the 30 s lease: the orphaned lease was released, it did not lapse.
    expect(Date.now() - resumedAt).toBeLessThan(LOCK_TIMEOUT / 2);
    for (const key of ['p1', 'p2']) {
      const answers = seen.get(key) ?? [];
      // A held key answers 409 (in progress) until it is released; a free one is served at once. Never a 5xx.
      expect(answers.slice(0, -1).every((status) => status === 409)).toBe(true);
      if (!held.includes(key)) expect(answers).toEqual([201]);
      expect((await post(plain, key)).headers['idempotent-replayed']).toBe('true');
      expect(runs.get(key)).toBe(1);
    }
  });
});

describe("plain mode, with pg's defaults (no timeouts)", () => {
  let url: string;
  let pool: pg.Pool;
  const errors: Error[] = [];
  beforeAll(async () => {
    pool = new pg.Pool(address());
    // The one setting not left to its default: without a listener, an idle client's error crashes the process.
    pool.on('error', (error) => errors.push(error));
    pools.push(pool);
    url = await plainApp(pool);
  });

  test('killed: 503 at once (connection refused), and every idle client emits an error on the pool', async () => {
    await until(async () => (await post(url, 'dk0')).status === 201);
    const idle = pool.idleCount;
    expect(idle).toBeGreaterThanOrEqual(1);
    const errorsBefore = errors.length;
    await server.kill();
    const started = Date.now();
    expect503(await post(url, 'dk1'));
    const elapsed = Date.now() - started;
    expect(elapsed).toBeLessThan(5000);
    expect(runs.get('dk1')).toBeUndefined();
    // Each idle client's connection ended: an 'error' event on the pool (fatal with no listener).
    await until(async () => errors.length - errorsBefore >= idle);
    console.log(
      `pg defaults, killed: 503 in ${elapsed} ms; ${errors.length - errorsBefore} pool 'error' events (${idle} idle clients): ${errors.at(-1)?.message}`,
    );
    await server.restart();
    await until(async () => (await post(url, 'dk1')).status === 201);
    expect(runs.get('dk1')).toBe(1);
  });

  test(`paused: a covered request is still waiting after ${DEFAULTS_WATCH / 1000} s, and is answered only once the server is resumed`, async () => {
    await until(async () => (await post(url, 'd0')).status === 201);
    server.pause();
    let answer: request.Response | undefined;
    let resumedAt = 0;
    try {
      const pending = post(url, 'd1').then((res) => {
        answer = res;
        return res;
      });
      await sleep(DEFAULTS_WATCH);
      // Nothing came back: no 503, no error, and the handler did not run. The request waits for the server.
      expect(answer).toBeUndefined();
      expect(runs.get('d1')).toBeUndefined();
      resumedAt = Date.now();
      server.resume();
      const res = await pending;
      expect(res.status).toBe(201);
      console.log(
        `pg defaults, paused: still pending after ${DEFAULTS_WATCH} ms; answered ${res.status} ${Date.now() - resumedAt} ms after the resume`,
      );
    } finally {
      if (resumedAt === 0) server.resume();
    }
    expect(runs.get('d1')).toBe(1);
  });
});

describe('transactional mode, with the recommended pool settings', () => {
  const rows = async (key: string) =>
    Number((await check.query('SELECT count(*) FROM charges WHERE key = $1', [key])).rows[0].count);

  test('a transaction in flight when the server is killed: the request gets 500 problem+json, nothing is kept, and after the restart the key runs again exactly once', async () => {
    await until(async () => (await post(transactional, 't0')).status === 201);
    const g = gate();
    gates.set('t1', g);
    const inFlight = post(transactional, 't1').then((res) => res); // sent now (supertest sends on then)
    await g.entered; // the handler's row is written, its transaction open
    await server.kill();
    g.open(); // the handler answers 201; the commit cannot happen
    const res = await inFlight;
    expect(res.status).toBeGreaterThanOrEqual(500);
    expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
    expect(res.body.type).toMatch(/transaction-failed/);
    expect(runs.get('t1')).toBe(1);
    // While it is down, the key gets 503 and the handler does not run.
    expect503(await post(transactional, 't1'));
    expect(runs.get('t1')).toBe(1);

    gates.delete('t1');
    await server.restart();
    await until(async () => (await check.query('SELECT 1')).rowCount === 1);
    expect(await rows('t1')).toBe(0); // rolled back: the crash took the open transaction with it
    expect(
      (await check.query('SELECT count(*) FROM oncely_idempotency WHERE key LIKE $1', ['%t1'])).rows[0].count,
    ).toBe('0');
    await until(async () => (await post(transactional, 't1')).status === 201);
    expect(runs.get('t1')).toBe(2); // the in-flight run (rolled back) and this one
    expect(await rows('t1')).toBe(1);
    expect((await post(transactional, 't1')).headers['idempotent-replayed']).toBe('true');
    expect(runs.get('t1')).toBe(2);
    expect(await rows('t1')).toBe(1);
  });

  test('paused: covered requests get 503 within the timeouts, no hang; resumed: served again', async () => {
    await until(async () => (await post(transactional, 'tp0')).status === 201);
    server.pause();
    try {
      const started = Date.now();
      const down = await Promise.all([post(transactional, 'tp1'), post(transactional, 'tp2')]);
      const elapsed = Date.now() - started;
      for (const res of down) expect503(res);
      expect(elapsed).toBeLessThan(10_000);
      expect(runs.get('tp1')).toBeUndefined();
      console.log(`transactional, paused: 2 covered requests answered 503 in ${elapsed} ms`);
    } finally {
      server.resume();
    }
    await until(async () => (await check.query('SELECT 1')).rowCount === 1);
    // The abandoned sessions ran at most their BEGIN, and rolled back on finding the connection closed: unlike plain
    // mode, no key is left reserved (no 409 while a lease runs out).
    for (const key of ['tp1', 'tp2']) {
      const answers: number[] = [];
      await until(async () => {
        const { status } = await post(transactional, key);
        answers.push(status);
        return status === 201;
      });
      expect(answers).not.toContain(409);
      expect((await post(transactional, key)).headers['idempotent-replayed']).toBe('true');
      expect(runs.get(key)).toBe(1);
      expect(await rows(key)).toBe(1);
    }
  });
});

describe('outbox relay, with the recommended pool settings', () => {
  test('killed while a batch is copied: the run fails (the process does not crash), the entry stays, and the next run after the restart copies it', async () => {
    const pool = recommendedPool();
    const store = new PostgresStore({ pool, outbox: true });
    const acquired = await store.acquire('r1', { fingerprint: 'f', lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error(`r1 not acquired: ${acquired.status}`);
    await store.complete('r1', acquired.token, { status: 201, headers: {}, body: Buffer.from('ok') }, 60_000);
    const g = gate();
    const cache: CompletedRecordCache = {
      get: async () => undefined,
      putCompleted: async (key) => {
        g.enter();
        await g.wait; // the batch's transaction is open meanwhile
        return key === 'r1';
      },
    };
    const relay = new OutboxRelay({ store, cache });
    const run = relay.runOnce().then(
      () => undefined,
      (error: unknown) => error,
    );
    await g.entered;
    await server.kill();
    g.open();
    const failure = await run;
    expect(failure).toBeInstanceOf(Error);
    await server.restart();
    await until(async () => (await check.query('SELECT 1')).rowCount === 1);
    const next = await relay.runOnce();
    expect(next.claimed).toBe(1);
    expect(next.copied).toEqual(['r1']);
  });
});

test('in none of the outages did a handler run twice for one key (but t1, whose first run was rolled back)', () => {
  const twice = [...runs].filter(([key, n]) => n !== 1 && key !== 't1');
  expect(twice).toEqual([]);
  expect(runs.get('t1')).toBe(2);
  expect(runs.size).toBeGreaterThanOrEqual(12);
});
