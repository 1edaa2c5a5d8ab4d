/**
 * @services mariadb
 */
import type { SqlTransactions } from '@oncely/core/adapter';
import { idempotency } from '@oncely/express';
import { fireAtOnce } from '@oncely/testing';
import express from 'express';
import mysql, { type Pool, type PoolConnection } from 'mysql2/promise';
import request from 'supertest';
import { MySQLStore, transactionConnection } from '../src';
import { mysqlUrl, testTables } from './helpers';

// Transactional mode through a database library given as `transactions` (what @oncely/orm builds for an ORM): here
// a minimal one over mysql2, whose transaction object is the test's own type, so the handler is seen to get it.
jest.setTimeout(30_000);

const db = testTables();
const records = db.table('txl');
const charges = db.table('txl_charges');
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The library's transaction: its own type, and closed once the library ended it. */
interface LibraryTx {
  readonly library: 'test';
  readonly connection: PoolConnection;
  closed: boolean;
}

/** An error as mysql2 gives one the server sent at COMMIT (a deadlock, as a Galera certification failure is). */
function serverRefusal(): Error {
  return Object.assign(new Error('Deadlock found when trying to get lock'), {
    code: 'ER_LOCK_DEADLOCK',
    errno: 1213,
    sqlState: '40001',
  });
}

/**
 * A callback-transaction library over `pool`: BEGIN, the work, COMMIT (or ROLLBACK), connection back to the pool.
 * `timeoutMs` ends a transaction on its own after that long, as Prisma's interactive transactions do.
 */
function library(pool: Pool, options: { timeoutMs?: number; failCommit?: () => boolean } = {}) {
  let opened = 0;
  const transactions: SqlTransactions<LibraryTx> = {
    dialect: 'mysql',
    async run(work) {
      const connection = await pool.getConnection();
      const tx: LibraryTx = { library: 'test', connection, closed: false };
      opened++;
      try {
        await connection.query('START TRANSACTION');
        let timer: NodeJS.Timeout | undefined;
        const timedOut = new Promise<never>((_, reject) => {
          if (options.timeoutMs !== undefined)
            timer = setTimeout(() => reject(new Error('transaction timed out')), options.timeoutMs);
        });
        try {
          await Promise.race([work(tx), timedOut]);
          if (options.failCommit?.()) throw serverRefusal();
          tx.closed = true;
          await connection.query('COMMIT');
        } catch (error) {
          tx.closed = true;
          await connection.query('ROLLBACK');
          throw error;
        } finally {
          clearTimeout(timer);
        }
      } finally {
        connection.release();
      }
    },
    async query(tx, statement, params) {
      if (tx.closed) throw new Error('this transaction is closed');
      const [result] = await tx.connection.execute(statement, params as never);
      if (Array.isArray(result))
        return { rows: result as Record<string, unknown>[], rowCount: result.length };
      return { rows: [], rowCount: (result as { affectedRows: number }).affectedRows };
    },
  };
  return { transactions, opened: () => opened };
}

const stores: MySQLStore<LibraryTx>[] = [];
function storeOn(pool: Pool, transactions: SqlTransactions<LibraryTx>): MySQLStore<LibraryTx> {
  const store = new MySQLStore({ pool, table: records, transactions });
  stores.push(store);
  return store;
}

beforeAll(async () => {
  await new MySQLStore({ pool: db.pool(), table: records }).migrate();
  await db
    .pool()
    .query(
      `CREATE TABLE \`${charges}\` (id INT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(200) NOT NULL, KEY (\`key\`))`,
    );
});
afterAll(async () => {
  for (const store of stores) await store.close();
  await db.drop();
});

const count = async (key: string) => {
  const [rows] = await db.pool().query(`SELECT count(*) AS n FROM \`${charges}\` WHERE \`key\` = ?`, [key]);
  return Number((rows as { n: number }[])[0]?.n);
};
const recordState = async (key: string) => {
  const [rows] = await db.pool().query(`SELECT state FROM \`${records}\` WHERE \`key\` = ?`, [key]);
  return (rows as { state: string }[])[0]?.state;
};

function app(store: MySQLStore<LibraryTx>, hold?: (key: string) => Promise<void>) {
  const server = express();
  server.use(express.json());
  server.use(idempotency({ store, transactional: true }));
  server.post('/charges', async (req, res, next) => {
    try {
      const tx = transactionConnection<LibraryTx>(req);
      if (tx.library !== 'test') throw new Error('not the library’s transaction');
      await store.transactions?.query(tx, `INSERT INTO \`${charges}\` (\`key\`) VALUES (?)`, [
        req.idempotencyKey,
      ]);
      await hold?.(req.idempotencyKey ?? '');
      if (req.body.fail) throw new Error('handler failed after its write');
      res.status(201).json({ charged: req.body.amount });
    } catch (error) {
      next(error);
    }
  });
  return server;
}

function expectPoolIdle(pool: Pool, checkedOut = 0): void {
  const core = (pool as unknown as { pool: { _allConnections: unknown[]; _freeConnections: unknown[] } })
    .pool;
  expect(core._allConnections.length - core._freeConnections.length).toBe(checkedOut);
}

test('the handler writes through the library’s transaction; its row and the record commit together', async () => {
  const lib = library(db.pool());
  const store = storeOn(db.pool(), lib.transactions);
  const server = app(store);
  await request(server).post('/charges').set('Idempotency-Key', 'lib-ok').send({ amount: 4 }).expect(201);
  expect(lib.opened()).toBe(1);
  expect(await count('lib-ok')).toBe(1);
  expect(await recordState('lib-ok')).toBe('completed');
  const replay = await request(server).post('/charges').set('Idempotency-Key', 'lib-ok').send({ amount: 4 });
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expect(replay.body).toEqual({ charged: 4 });
  expect(await count('lib-ok')).toBe(1);

  // A failing handler: the library rolls back its row and the record; the retry runs again.
  await request(server).post('/charges').set('Idempotency-Key', 'lib-fail').send({ fail: true }).expect(500);
  expect(await count('lib-fail')).toBe(0);
  expect(await recordState('lib-fail')).toBeUndefined();
  await request(server).post('/charges').set('Idempotency-Key', 'lib-fail').send({}).expect(201);
  expect(await count('lib-fail')).toBe(1);
  // Only the store's lock connection stays checked out, until close().
  expectPoolIdle(db.pool(), 1);
  await store.close();
  expectPoolIdle(db.pool());
});

test('a duplicate gets 409 at once, from the same store (re-entrant lock) and from another store', async () => {
  const lib = library(db.pool());
  let reached!: () => void;
  const held = new Promise<void>((resolve) => {
    reached = resolve;
  });
  let release!: () => void;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const store = storeOn(db.pool(), lib.transactions);
  const other = storeOn(db.pool(), lib.transactions);
  const hold = () => {
    reached();
    return gate;
  };
  const first = request(app(store, hold))
    .post('/charges')
    .set('Idempotency-Key', 'lib-dup')
    .send({})
    .then((r) => r);
  await held;
  // Answered while the first still holds its row: a duplicate waiting on the row would get the replay instead.
  const same = await request(app(store)).post('/charges').set('Idempotency-Key', 'lib-dup').send({});
  expect(same.status).toBe(409);
  const elsewhere = await request(app(other)).post('/charges').set('Idempotency-Key', 'lib-dup').send({});
  expect(elsewhere.status).toBe(409);
  release();
  expect((await first).status).toBe(201);
  expect(await count('lib-dup')).toBe(1);
  await Promise.all([store.close(), other.close()]);
});

test('a library on the store’s own pool of 4: 300 concurrent requests over 100 keys, no pool deadlock', async () => {
  const pool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 4 });
  try {
    const lib = library(pool);
    const store = storeOn(pool, lib.transactions);
    const server = app(store, () => sleep(5)).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const address = server.address();
    const url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
    const keys = Array.from({ length: 300 }, (_, i) => `lib-small-${Math.floor(i / 3)}`);
    const results = await fireAtOnce({ urls: [url], path: '/charges', keys, total: 300 });
    await new Promise((resolve) => server.close(resolve));
    const statuses = new Set(results.map((r) => r.status));
    expect([...statuses].filter((s) => s !== 201 && s !== 409)).toEqual([]);
    const [rows] = await db
      .pool()
      .query(
        `SELECT count(DISTINCT \`key\`) AS k, count(*) AS n FROM \`${charges}\` WHERE \`key\` LIKE 'lib-small-%'`,
      );
    const { k, n } = (rows as { k: number; n: number }[])[0] ?? { k: 0, n: 0 };
    expect(Number(n)).toBe(Number(k)); // one row per key that ran
    expect(Number(k)).toBe(results.filter((r) => r.status === 201 && !r.replayed).length);
    await store.close();
    expectPoolIdle(pool);
  } finally {
    await pool.end();
  }
});

test('a transaction the library ended on its own (timeout) leaves no lock: the retry runs', async () => {
  const lib = library(db.pool(), { timeoutMs: 200 });
  const store = storeOn(db.pool(), lib.transactions);
  const server = app(store, () => sleep(500));
  const first = await request(server).post('/charges').set('Idempotency-Key', 'lib-timeout').send({});
  expect(first.status).toBe(500);
  expect(await count('lib-timeout')).toBe(0);
  // The key is free at once: a lock left on the library's connection (now back in its pool) would answer 409.
  const fast = app(store);
  await request(fast).post('/charges').set('Idempotency-Key', 'lib-timeout').send({}).expect(201);
  expect(await count('lib-timeout')).toBe(1);
  await store.close();
  expectPoolIdle(db.pool());
});

test('a commit the server refuses: 500 transaction-failed, nothing kept, the retry runs', async () => {
  let fail = true;
  const lib = library(db.pool(), { failCommit: () => fail });
  const store = storeOn(db.pool(), lib.transactions);
  const res = await request(app(store)).post('/charges').set('Idempotency-Key', 'lib-commit').send({});
  expect(res.status).toBe(500);
  expect(res.body.type).toBe('https://oncely.dev/problems/transaction-failed');
  expect(await count('lib-commit')).toBe(0);
  expect(await recordState('lib-commit')).toBeUndefined();
  fail = false;
  await request(app(store)).post('/charges').set('Idempotency-Key', 'lib-commit').send({}).expect(201);
  await store.close();
});

test('store.transaction() hands the work the library’s transaction', async () => {
  const lib = library(db.pool());
  const store = storeOn(db.pool(), lib.transactions);
  const result = await store.transaction('lib-msg', {}, async (tx) => {
    await lib.transactions.query(tx, `INSERT INTO \`${charges}\` (\`key\`) VALUES (?)`, ['lib-msg']);
    return tx.library;
  });
  expect(result).toEqual({ outcome: 'executed', result: 'test' });
  expect(await store.transaction('lib-msg', {}, async () => 'again')).toEqual({
    outcome: 'replayed',
    result: 'test',
  });
  expect(await count('lib-msg')).toBe(1);
  await store.close();
});
