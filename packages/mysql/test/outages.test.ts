/**
 * @services mariadb-server
 */
import { idempotency } from '@oncely/express';
import {
  endOutages,
  expect503,
  expectRanOnceEach,
  killAndRestart,
  killInFlight,
  type OutageApp,
  type OutageChecks,
  type OutageState,
  type PrivateMariadb,
  pauseInFlight,
  type ServedOutageApp,
  servedAfterResume,
  serveOutageApp,
  sleep,
  startMariadbServer,
  until,
} from '@oncely/testing';
import type express from 'express';
import mysql from 'mysql2/promise';
import { MySQLStore, QueryTimeoutError, transactionConnection, withQueryTimeout } from '../src';

// Outages on a private MariaDB server (mariadb-install-db + mariadbd from the system binaries, on a free port):
// killed (SIGKILL), restarted on its data, paused (SIGSTOP). The pool is configured as docs/stores/mysql.md
// recommends, with shorter timeouts, so that every outage fails fast; one case shows what mysql2's defaults do.
jest.setTimeout(60_000);

const CONNECT_TIMEOUT = 1000;
const QUERY_TIMEOUT = 1500;
/** The default lease: a key left in progress by an orphaned acquire must be freed by the store well before it ends. */
const LOCK_TIMEOUT = 30_000;
/** How long a request with mysql2's defaults is watched during a pause before the server is resumed. */
const DEFAULTS_WATCH = 3000;

let server: PrivateMariadb;
const pools: mysql.Pool[] = [];
/** Handler runs and gates per key over every app of this file, and the apps' servers. */
const state: OutageState = { runs: new Map(), gates: new Map(), servers: [] };
const { runs } = state;

/** The pool the docs recommend (timeouts shortened for the test). */
function recommendedPool(): mysql.Pool {
  const pool = mysql.createPool({
    uri: server.url,
    connectionLimit: 10,
    connectTimeout: CONNECT_TIMEOUT,
    enableKeepAlive: true,
    maxIdle: 10,
    idleTimeout: 60_000,
  });
  pools.push(pool);
  return withQueryTimeout(pool, QUERY_TIMEOUT);
}

let plain: OutageApp;
/** In transactional mode: the handler inserts a row through the request's transaction. */
let transactional: ServedOutageApp;
let check: mysql.Pool;
const checks: OutageChecks = {
  ready: async () => (await check.query('SELECT 1')).length > 0,
  rows: async (key) => {
    const [found] = await check.execute('SELECT COUNT(*) AS n FROM charges WHERE `key` = ?', [key]);
    return Number((found as { n: number }[])[0]?.n);
  },
};

beforeAll(async () => {
  server = await startMariadbServer();
  const pool = recommendedPool();
  await new MySQLStore({ pool }).migrate();
  await pool.query('CREATE TABLE charges (id INT AUTO_INCREMENT PRIMARY KEY, `key` VARCHAR(100) NOT NULL)');
  plain = await serveOutageApp(
    idempotency({ store: new MySQLStore({ pool }), lockTimeout: LOCK_TIMEOUT }),
    state,
  );
  transactional = await serveOutageApp(
    idempotency({ store: new MySQLStore({ pool }), transactional: true }),
    state,
    (req: express.Request, key) =>
      transactionConnection(req).execute('INSERT INTO charges (`key`) VALUES (?)', [key]),
  );
  check = recommendedPool();
}, 60_000);

afterAll(() => endOutages(state, server, pools));

describe('plain mode, with the recommended pool settings', () => {
  test('killed: covered requests get 503 problem+json at once and the handler does not run; restarted: served again, same app and pool', async () => {
    const elapsed = await killAndRestart(server, plain, ['k1', 'k2', 'before']);
    console.log(`killed: 4 covered requests answered 503 in ${elapsed} ms`);
  });

  test('paused (SIGSTOP): 503 within the timeouts, no hang; resumed: served again, keys not held for the lease', async () => {
    // Two pooled connections at least, so that one request meets an idle connection and not only a new one.
    await until(async () =>
      (await Promise.all([plain.post('p0'), plain.post('p00')])).every((r) => r.status === 201),
    );
    server.pause();
    try {
      const started = Date.now();
      const down = await Promise.all([plain.post('p1'), plain.post('p2'), plain.post('p3')]);
      const elapsed = Date.now() - started;
      for (const res of down) expect503(res);
      expect(elapsed).toBeGreaterThanOrEqual(CONNECT_TIMEOUT - 50);
      expect(elapsed).toBeLessThan(10_000);
      for (const key of ['p1', 'p2', 'p3']) expect(runs.get(key)).toBeUndefined();
      console.log(`paused: 3 covered requests answered 503 in ${elapsed} ms`);
    } finally {
      server.resume();
    }
    const resumedAt = Date.now();
    await until(checks.ready);
    const seen = await servedAfterResume(plain, ['p1', 'p2', 'p3']);
    console.log(
      `paused, after the resume: answers until served: ${[...seen].map(([key, answers]) => `${key}: ${answers.join(',')}`).join('; ')}; all served ${Date.now() - resumedAt} ms after the resume (lockTimeout ${LOCK_TIMEOUT} ms)`,
    );
    // Far below the 30 s lease: a lease reserved by an acquire that ran after the client gave up was released.
    expect(Date.now() - resumedAt).toBeLessThan(LOCK_TIMEOUT / 2);
  });
});

describe("mysql2's defaults (no query timeout)", () => {
  test(`paused: a statement on a pooled connection is still waiting after ${DEFAULTS_WATCH / 1000} s, even with mysql2's own per-query timeout, and withQueryTimeout ends it`, async () => {
    const raw = mysql.createPool({ uri: server.url, connectionLimit: 2 });
    pools.push(raw);
    const timed = withQueryTimeout(raw, QUERY_TIMEOUT);
    // Two idle connections, neither of which has prepared the statements below.
    await Promise.all([raw.query('SELECT SLEEP(0.05)'), raw.query('SELECT SLEEP(0.05)')]);
    server.pause();
    let resumed = false;
    try {
      let answer: string | undefined;
      // execute() prepares first, and mysql2's timeout covers only the execution: this one never times out.
      const pending = raw.execute({ sql: 'SELECT ? AS n', timeout: QUERY_TIMEOUT }, [1]).then(
        () => {
          answer = 'answered';
        },
        (error: Error) => {
          answer = error.message;
        },
      );
      const started = Date.now();
      const bounded = await timed.execute('SELECT ? + 1 AS n', [1]).then(
        () => 'answered',
        (error: unknown) => error,
      );
      expect(bounded).toBeInstanceOf(QueryTimeoutError);
      expect(Date.now() - started).toBeLessThan(QUERY_TIMEOUT + 1000);
      await sleep(Math.max(0, DEFAULTS_WATCH - (Date.now() - started)));
      expect(answer).toBeUndefined();
      server.resume();
      resumed = true;
      await pending;
      // Answered only once the server came back.
      expect(answer).toBe('answered');
    } finally {
      if (!resumed) server.resume();
    }
    // The pool still serves: the connection the deadline destroyed was replaced.
    expect(await timed.execute('SELECT 1 AS n')).toEqual([[{ n: 1 }], expect.anything()]);
  });
});

describe('transactional mode, with the recommended pool settings', () => {
  test('a transaction in flight when the server is killed: a 5xx problem+json, nothing kept, the process alive; after the restart the key runs again exactly once', async () => {
    const res = await killInFlight(server, transactional, checks, ['t0', 't1']);
    console.log(`transactional, killed in flight: ${res.status} ${res.body.type}`);
  });

  test('paused: covered requests get 503 within the timeouts, no hang; resumed: served again, each once', async () => {
    const { elapsed, seen } = await pauseInFlight(server, transactional, checks, ['tp0', 'tp1', 'tp2']);
    console.log(`transactional, paused: 2 covered requests answered 503 in ${elapsed} ms`);
    console.log(
      `transactional, paused, after the resume: ${[...seen].map(([key, answers]) => `${key}: ${answers.join(',')}`).join('; ')}`,
    );
  });
});

describe('a connection lost with a transaction open', () => {
  test('fails the transaction, not the process; after the restart nothing of it is kept and the pool serves again', async () => {
    const pool = recommendedPool();
    const connection = await pool.getConnection();
    await connection.beginTransaction();
    await connection.execute('INSERT INTO charges (`key`) VALUES (?)', ['lost']);
    // Idle between statements, as a handler awaiting an HTTP call: the server dies under the open transaction.
    await server.kill();
    await sleep(200);
    await expect(connection.execute('INSERT INTO charges (`key`) VALUES (?)', ['lost'])).rejects.toThrow();
    await expect(connection.rollback()).rejects.toThrow();
    connection.release();
    await server.restart();
    await until(async () => (await pool.query('SELECT 1')).length > 0);
    const [rows] = await pool.execute('SELECT COUNT(*) AS n FROM charges WHERE `key` = ?', ['lost']);
    expect(rows).toEqual([{ n: 0 }]);
    await until(async () => (await plain.post('after-lost')).status === 201);
  });
});

test('in none of the outages did a handler run twice for one key (but t1, whose first run was rolled back)', () => {
  expectRanOnceEach(runs, 't1', 8);
});
