/**
 * @services mariadb-server
 */
import type { Server } from 'node:http';
import { idempotency } from '@oncely/express';
import {
  closeServers,
  expect503,
  type Gate,
  gate,
  gatedRoute,
  killAndRestart,
  listen,
  type OutageApp,
  type PrivateMariadb,
  servedAfterResume,
  startMariadbServer,
  until,
} from '@oncely/testing';
import express from 'express';
import mysql from 'mysql2/promise';
import request from 'supertest';
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

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let server: PrivateMariadb;
const pools: mysql.Pool[] = [];
const servers: Server[] = [];
/** Handler runs per key, over every app of this file. */
const runs = new Map<string, number>();

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

/** An app in plain mode over `pool`. */
async function plainApp(pool: mysql.Pool): Promise<string> {
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: new MySQLStore({ pool }), lockTimeout: LOCK_TIMEOUT }));
  app.post('/charges', (req, res) => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    res.status(201).json({ ok: true });
  });
  return listen(app, servers);
}

const gates = new Map<string, Gate>();

/** An app in transactional mode over `pool`: the handler inserts a row through the request's transaction. */
async function transactionalApp(pool: mysql.Pool): Promise<string> {
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: new MySQLStore({ pool }), transactional: true }));
  app.post(
    '/charges',
    gatedRoute(runs, gates, (req: express.Request, key) =>
      transactionConnection(req).execute('INSERT INTO charges (`key`) VALUES (?)', [key]),
    ),
  );
  return listen(app, servers);
}

const post = (url: string, key: string) =>
  request(url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 });

let plain: string;
let transactional: string;
let check: mysql.Pool;
/** The plain-mode app, as the shared outage checks take it. */
const plainOutage: OutageApp = { post: (key) => post(plain, key), runs };

beforeAll(async () => {
  server = await startMariadbServer();
  const pool = recommendedPool();
  await new MySQLStore({ pool }).migrate();
  await pool.query('CREATE TABLE charges (id INT AUTO_INCREMENT PRIMARY KEY, `key` VARCHAR(100) NOT NULL)');
  plain = await plainApp(pool);
  transactional = await transactionalApp(pool);
  check = recommendedPool();
}, 60_000);

afterAll(async () => {
  closeServers(servers);
  server?.resume();
  await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
  await server?.stop();
});

describe('plain mode, with the recommended pool settings', () => {
  test('killed: covered requests get 503 problem+json at once and the handler does not run; restarted: served again, same app and pool', async () => {
    const elapsed = await killAndRestart(server, plainOutage, ['k1', 'k2', 'before']);
    console.log(`killed: 4 covered requests answered 503 in ${elapsed} ms`);
  });

  test('paused (SIGSTOP): 503 within the timeouts, no hang; resumed: served again, keys not held for the lease', async () => {
    // Two pooled connections at least, so that one request meets an idle connection and not only a new one.
    await until(async () =>
      (await Promise.all([post(plain, 'p0'), post(plain, 'p00')])).every((r) => r.status === 201),
    );
    server.pause();
    try {
      const started = Date.now();
      const down = await Promise.all([post(plain, 'p1'), post(plain, 'p2'), post(plain, 'p3')]);
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
    await until(async () => (await check.query('SELECT 1')).length > 0);
    const seen = await servedAfterResume(plainOutage, ['p1', 'p2', 'p3']);
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
  const rows = async (key: string) => {
    const [found] = await check.execute('SELECT COUNT(*) AS n FROM charges WHERE `key` = ?', [key]);
    return Number((found as { n: number }[])[0]?.n);
  };

  test('a transaction in flight when the server is killed: a 5xx problem+json, nothing kept, the process alive; after the restart the key runs again exactly once', async () => {
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
    expect(runs.get('t1')).toBe(1);
    console.log(`transactional, killed in flight: ${res.status} ${res.body.type}`);
    // While it is down, the key gets 503 and the handler does not run.
    expect503(await post(transactional, 't1'));
    expect(runs.get('t1')).toBe(1);

    gates.delete('t1');
    await server.restart();
    await until(async () => (await check.query('SELECT 1')).length > 0);
    expect(await rows('t1')).toBe(0); // rolled back: the crash took the open transaction with it
    await until(async () => (await post(transactional, 't1')).status === 201);
    expect(runs.get('t1')).toBe(2); // the in-flight run (rolled back) and this one
    expect(await rows('t1')).toBe(1);
    expect((await post(transactional, 't1')).headers['idempotent-replayed']).toBe('true');
    expect(runs.get('t1')).toBe(2);
  });

  test('paused: covered requests get 503 within the timeouts, no hang; resumed: served again, each once', async () => {
    await until(async () => (await post(transactional, 'tp0')).status === 201);
    server.pause();
    try {
      const started = Date.now();
      const down = await Promise.all([post(transactional, 'tp1'), post(transactional, 'tp2')]);
      const elapsed = Date.now() - started;
      for (const res of down) expect503(res);
      expect(elapsed).toBeLessThan(10_000);
      expect(runs.get('tp1')).toBeUndefined();
      expect(runs.get('tp2')).toBeUndefined();
      console.log(`transactional, paused: 2 covered requests answered 503 in ${elapsed} ms`);
    } finally {
      server.resume();
    }
    await until(async () => (await check.query('SELECT 1')).length > 0);
    const seen = await servedAfterResume({ post: (key) => post(transactional, key), runs }, ['tp1', 'tp2']);
    console.log(
      `transactional, paused, after the resume: ${[...seen].map(([key, answers]) => `${key}: ${answers.join(',')}`).join('; ')}`,
    );
    expect(await rows('tp1')).toBe(1);
    expect(await rows('tp2')).toBe(1);
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
    await until(async () => (await post(plain, 'after-lost')).status === 201);
  });
});

test('in none of the outages did a handler run twice for one key (but t1, whose first run was rolled back)', () => {
  const twice = [...runs].filter(([key, n]) => n !== 1 && key !== 't1');
  expect(twice).toEqual([]);
  expect(runs.get('t1')).toBe(2);
  expect(runs.size).toBeGreaterThanOrEqual(8);
});
