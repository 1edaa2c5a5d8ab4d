/**
 * @services postgres-server
 */
import { idempotency } from '@oncely/express';
import {
  endOutages,
  expect503,
  expectRanOnceEach,
  gate,
  killAndRestart,
  killInFlight,
  type OutageApp,
  type OutageChecks,
  type OutageState,
  type PrivatePostgres,
  pauseInFlight,
  type ServedOutageApp,
  servedAfterResume,
  serveOutageApp,
  sleep,
  startPostgres,
  until,
} from '@oncely/testing';
import type express from 'express';
import pg from 'pg';
import type request from 'supertest';
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

let server: PrivatePostgres;
const pools: pg.Pool[] = [];
/** Errors the pools emitted (idle clients whose connection died): counted, never thrown. */
const poolErrors: Error[] = [];
/** Handler runs and gates per key over every app of this file, and the apps' servers. */
const state: OutageState = { runs: new Map(), gates: new Map(), servers: [] };
const { runs } = state;

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

/** An app in plain mode over `pool`. */
const plainApp = (pool: pg.Pool) =>
  serveOutageApp(idempotency({ store: new PostgresStore({ pool }), lockTimeout: LOCK_TIMEOUT }), state);

let plain: OutageApp;
/** In transactional mode: the handler inserts a row through the request's transaction. */
let transactional: ServedOutageApp;
let check: pg.Pool;
const checks: OutageChecks = {
  ready: async () => (await check.query('SELECT 1')).rowCount === 1,
  rows: async (key) =>
    Number((await check.query('SELECT count(*) FROM charges WHERE key = $1', [key])).rows[0].count),
};

beforeAll(async () => {
  server = await startPostgres();
  const pool = recommendedPool();
  // With the outbox: its table too, for the relay's test.
  await new PostgresStore({ pool, outbox: true }).migrate();
  await pool.query('CREATE TABLE charges (id serial PRIMARY KEY, key text NOT NULL)');
  plain = await plainApp(pool);
  transactional = await serveOutageApp(
    idempotency({ store: new PostgresStore({ pool }), transactional: true }),
    state,
    (req: express.Request, key) =>
      transactionClient(req).query('INSERT INTO charges (key) VALUES ($1)', [key]),
  );
  check = recommendedPool();
});

afterAll(() => endOutages(state, server, pools));

describe('plain mode, with the recommended pool settings', () => {
  test('killed: covered requests get 503 problem+json within a few seconds and the handler does not run; restarted: served again, same app and pool', async () => {
    const elapsed = await killAndRestart(server, plain, ['k1', 'k2', 'before']);
    console.log(`killed: 4 covered requests answered 503 in ${elapsed} ms`);
  });

  test('paused (SIGSTOP on the postmaster and its backends): 503 after the timeouts, no hang; resumed: served again', async () => {
    await until(async () => (await plain.post('p0')).status === 201);
    server.pause();
    try {
      const started = Date.now();
      // Two at once: one gets the pool's idle connection (its query times out), one opens a new connection (its
      // startup times out, the postmaster being stopped).
      const down = await Promise.all([plain.post('p1'), plain.post('p2')]);
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
    await until(checks.ready);
    // The acquire sent on the pool's idle connection was still in the paused backend's socket: the client gave up
    // (query_timeout) and closed the connection, but on SIGCONT the backend ran it before reading the close, and
    // reserved the key for a lease nobody owns. The store keeps releasing that lease behind the failed acquire
    // (undoAcquire), so such a key answers 409 for a moment, not for the lease's 30 s, then runs once.
    const { rows } = await check.query<{ key: string }>(
      "SELECT key FROM oncely_idempotency WHERE state = 'in_progress' AND (key LIKE '%p1' OR key LIKE '%p2')",
    );
    const held = rows.map((row) => row.key.slice(-2));
    const seen = await servedAfterResume(plain, ['p1', 'p2']);
    console.log(
      `paused, after the resume: keys held by an orphaned acquire: [${held}]; answers until served: ${[...seen].map(([key, answers]) => `${key}: ${answers.length - 1} x 409 then ${answers.at(-1)}`).join(', ')}; all served ${Date.now() - resumedAt} ms after the resume (lockTimeout ${LOCK_TIMEOUT} ms)`,
    );
    // Generous, yet far below the 30 s lease: the orphaned lease was released, it did not lapse.
    expect(Date.now() - resumedAt).toBeLessThan(LOCK_TIMEOUT / 2);
    // A key no orphaned acquire held is served at once.
    for (const key of ['p1', 'p2']) if (!held.includes(key)) expect(seen.get(key)).toEqual([201]);
  });
});

describe("plain mode, with pg's defaults (no timeouts)", () => {
  let defaults: OutageApp;
  let pool: pg.Pool;
  const errors: Error[] = [];
  beforeAll(async () => {
    pool = new pg.Pool(address());
    // The one setting not left to its default: without a listener, an idle client's error crashes the process.
    pool.on('error', (error) => errors.push(error));
    pools.push(pool);
    defaults = await plainApp(pool);
  });

  test('killed: 503 at once (connection refused), and every idle client emits an error on the pool', async () => {
    await until(async () => (await defaults.post('dk0')).status === 201);
    const idle = pool.idleCount;
    expect(idle).toBeGreaterThanOrEqual(1);
    const errorsBefore = errors.length;
    await server.kill();
    const started = Date.now();
    expect503(await defaults.post('dk1'));
    const elapsed = Date.now() - started;
    expect(elapsed).toBeLessThan(5000);
    expect(runs.get('dk1')).toBeUndefined();
    // Each idle client's connection ended: an 'error' event on the pool (fatal with no listener).
    await until(async () => errors.length - errorsBefore >= idle);
    console.log(
      `pg defaults, killed: 503 in ${elapsed} ms; ${errors.length - errorsBefore} pool 'error' events (${idle} idle clients): ${errors.at(-1)?.message}`,
    );
    await server.restart();
    await until(async () => (await defaults.post('dk1')).status === 201);
    expect(runs.get('dk1')).toBe(1);
  });

  test(`paused: a covered request is still waiting after ${DEFAULTS_WATCH / 1000} s, and is answered only once the server is resumed`, async () => {
    await until(async () => (await defaults.post('d0')).status === 201);
    server.pause();
    let answer: request.Response | undefined;
    let resumedAt = 0;
    try {
      const pending = defaults.post('d1').then((res) => {
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
  test('a transaction in flight when the server is killed: the request gets 500 problem+json, nothing is kept, and after the restart the key runs again exactly once', async () => {
    const res = await killInFlight(
      server,
      transactional,
      {
        ...checks,
        // Neither is the record: it was written in the same transaction.
        afterRestart: async () =>
          expect(
            (await check.query('SELECT count(*) FROM oncely_idempotency WHERE key LIKE $1', ['%t1'])).rows[0]
              .count,
          ).toBe('0'),
      },
      ['t0', 't1'],
    );
    expect(res.body.type).toMatch(/transaction-failed/);
  });

  test('paused: covered requests get 503 within the timeouts, no hang; resumed: served again', async () => {
    const { elapsed, seen } = await pauseInFlight(server, transactional, checks, ['tp0', 'tp1', 'tp2']);
    console.log(`transactional, paused: 2 covered requests answered 503 in ${elapsed} ms`);
    // The abandoned sessions ran at most their BEGIN, and rolled back on finding the connection closed: unlike plain
    // mode, no key is left reserved (no 409 while a lease runs out).
    for (const key of ['tp1', 'tp2']) expect(seen.get(key)).not.toContain(409);
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
    await until(checks.ready);
    const next = await relay.runOnce();
    expect(next.claimed).toBe(1);
    expect(next.copied).toEqual(['r1']);
  });
});

test('in none of the outages did a handler run twice for one key (but t1, whose first run was rolled back)', () => {
  expectRanOnceEach(runs, 't1', 12);
});
