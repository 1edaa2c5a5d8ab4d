/**
 * @services mariadb
 */
import {
  currentIdempotency,
  IdempotencyInProgressError,
  IdempotencyMismatchError,
  IdempotencySetupError,
} from '@oncely/core';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import express from 'express';
import Fastify from 'fastify';
import type { Pool, PoolConnection } from 'mysql2/promise';
import request from 'supertest';
import { MySQLStore, transactionConnection } from '../src';
import { testTables } from './helpers';

jest.setTimeout(30_000);

const db = testTables();
const records = db.table('tx');
const charges = db.table('tx_charges');
let store: MySQLStore;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  store = new MySQLStore({ pool: db.pool(), table: records });
  await store.migrate();
  await db
    .pool()
    .query(
      `CREATE TABLE \`${charges}\` (id INT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(200) NOT NULL, KEY (\`key\`))`,
    );
});
afterAll(() => db.drop());

const count = async (key: string) => {
  const [rows] = await db.pool().query(`SELECT count(*) AS n FROM \`${charges}\` WHERE \`key\` = ?`, [key]);
  return Number((rows as { n: number }[])[0]?.n);
};
const recordState = async (key: string) => {
  const [rows] = await db.pool().query(`SELECT state FROM \`${records}\` WHERE \`key\` = ?`, [key]);
  return (rows as { state: string }[])[0]?.state;
};
const charge = (connection: PoolConnection, key: string | undefined) =>
  connection.query(`INSERT INTO \`${charges}\` (\`key\`) VALUES (?)`, [key]);

/** No connection checked out once the requests are answered: a leaked one would hold its named lock. */
function expectPoolIdle(pool: Pool = db.pool()): void {
  const core = (pool as unknown as { pool: { _allConnections: unknown[]; _freeConnections: unknown[] } })
    .pool;
  expect(core._freeConnections.length).toBe(core._allConnections.length);
}

/** Holds a handler after its write (`hold`) until `open`; `reached` resolves once a handler is held. */
type Gate = { hold: () => Promise<void>; reached: Promise<void>; open: () => void };
function gate(): Gate {
  let open!: () => void;
  let reach!: () => void;
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  const reached = new Promise<void>((resolve) => {
    reach = resolve;
  });
  return {
    hold: () => {
      reach();
      return wait;
    },
    reached,
    open,
  };
}

function expressApp(options: { wait?: boolean; on?: MySQLStore } = {}) {
  const gates = new Map<string, Gate>();
  const app = express();
  app.use(express.json());
  app.use(
    idempotency({
      store: options.on ?? store,
      transactional: true,
      ...(options.wait ? { inProgress: { wait: '10s' } } : {}),
    }),
  );
  app.post('/charges', async (req, res, next) => {
    try {
      const connection = transactionConnection(req);
      await charge(connection, req.idempotencyKey);
      await gates.get(req.idempotencyKey ?? '')?.hold();
      if (req.body.fail) throw new Error('handler failed after its write');
      if (req.body.killConnection) {
        // Another session ends this one before the commit: the server rolls the transaction back.
        const [rows] = await connection.query('SELECT CONNECTION_ID() AS id');
        await db.pool().query('KILL CONNECTION ?', [(rows as { id: number }[])[0]?.id]);
      }
      res.status(201).json({ charged: req.body.amount });
    } catch (error) {
      next(error);
    }
  });
  return { app, gates };
}

describe('transactional mode over HTTP (Express)', () => {
  test('the business row and the record commit together; the replay comes from the record', async () => {
    const { app } = expressApp();
    await request(app).post('/charges').set('Idempotency-Key', 'together').send({ amount: 5 }).expect(201);
    expect(await count('together')).toBe(1);
    expect(await recordState('together')).toBe('completed');
    const replay = await request(app).post('/charges').set('Idempotency-Key', 'together').send({ amount: 5 });
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ charged: 5 });
    expect(await count('together')).toBe(1);
    expectPoolIdle();
  });

  test('a handler that fails after writing leaves neither row nor record; the retry runs again', async () => {
    const { app } = expressApp();
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'fails')
      .send({ amount: 1, fail: true })
      .expect(500);
    expect(await count('fails')).toBe(0);
    expect(await recordState('fails')).toBeUndefined();
    await request(app).post('/charges').set('Idempotency-Key', 'fails').send({ amount: 1 }).expect(201);
    expect(await count('fails')).toBe(1);
    expectPoolIdle();
  });

  test('the connection lost before the commit: 500 transaction-failed, nothing kept, the retry runs', async () => {
    const { app } = expressApp();
    const lost = await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'lost')
      .send({ amount: 1, killConnection: true });
    expect(lost.status).toBe(500);
    expect(lost.body.type).toBe('https://oncely.dev/problems/transaction-failed');
    expect(await count('lost')).toBe(0);
    expect(await recordState('lost')).toBeUndefined();
    // The killed connection was discarded, not given back to the pool, and its named lock went with it.
    await request(app).post('/charges').set('Idempotency-Key', 'lost').send({ amount: 1 }).expect(201);
    expect(await count('lost')).toBe(1);
    expectPoolIdle();
  });

  test('a concurrent duplicate gets 409 at once while the first transaction is open', async () => {
    const { app, gates } = expressApp();
    const g = gate();
    gates.set('open-tx', g);
    const first = request(app)
      .post('/charges')
      .set('Idempotency-Key', 'open-tx')
      .send({ amount: 2 })
      .then((r) => r);
    await g.reached;
    // Answered while the first still holds its row: a duplicate waiting on the row would get the replay instead.
    const second = await request(app).post('/charges').set('Idempotency-Key', 'open-tx').send({ amount: 2 });
    expect(second.status).toBe(409);
    expect(second.headers['retry-after']).toBeDefined();
    expect(await count('open-tx')).toBe(0); // not committed yet: invisible to others
    g.open();
    expect((await first).status).toBe(201);
    expect(await count('open-tx')).toBe(1);
    expectPoolIdle();
  });

  test('in wait mode, the duplicate waits for the commit and gets the replay', async () => {
    const { app, gates } = expressApp({ wait: true });
    const g = gate();
    gates.set('wait-tx', g);
    const first = request(app)
      .post('/charges')
      .set('Idempotency-Key', 'wait-tx')
      .send({ amount: 3 })
      .then((r) => r);
    await g.reached;
    const second = request(app)
      .post('/charges')
      .set('Idempotency-Key', 'wait-tx')
      .send({ amount: 3 })
      .then((r) => r);
    await sleep(300);
    g.open();
    const [a, b] = await Promise.all([first, second]);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(await count('wait-tx')).toBe(1);
  });

  test('a row held by a session without the named lock: the lock wait times out into a 409, not a 5xx', async () => {
    // Another session (a plain-mode acquire, a migration script) holds the key's row in an open transaction.
    const other = await db.pool().getConnection();
    const impatient = testTables();
    impatient.pool().on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1');
    });
    try {
      await other.query('START TRANSACTION');
      await other.query(
        `INSERT INTO \`${records}\` (\`key\`, fingerprint, state, token, lock_expires_at, expires_at, created_at)
         VALUES ('row-held', '', 'in_progress', 'outsider', 0, 0, 0)`,
      );
      const { app } = expressApp({ on: new MySQLStore({ pool: impatient.pool(), table: records }) });
      const res = await request(app).post('/charges').set('Idempotency-Key', 'row-held').send({ amount: 1 });
      expect(res.status).toBe(409);
      expect(await count('row-held')).toBe(0);
      expectPoolIdle(impatient.pool());
    } finally {
      await other.query('ROLLBACK');
      other.release();
      await impatient.drop();
    }
  });

  test('a deadlock in the acquire starts over in a new transaction, not in autocommit', async () => {
    // InnoDB rolls back a deadlock victim's whole transaction: the acquire that was chosen runs again in a new one.
    // Were it rerun on the same session, the record and the handler's row would autocommit, and survive its failure.
    const pool = db.pool();
    const getConnection = pool.getConnection.bind(pool);
    let deadlocks = 0;
    const faulty = Object.create(pool) as Pool;
    faulty.getConnection = async () => {
      const connection = await getConnection();
      const proxy = Object.create(connection) as PoolConnection;
      proxy.execute = (async (statement: string, params: unknown[]) => {
        if (deadlocks === 0 && statement.startsWith('INSERT INTO')) {
          deadlocks++;
          await connection.query('ROLLBACK');
          throw Object.assign(new Error('Deadlock found when trying to get lock'), {
            errno: 1213,
            code: 'ER_LOCK_DEADLOCK',
          });
        }
        return connection.execute(statement, params as never);
      }) as PoolConnection['execute'];
      return proxy;
    };
    const { app } = expressApp({ on: new MySQLStore({ pool: faulty, table: records }) });
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'deadlocked')
      .send({ amount: 1, fail: true })
      .expect(500);
    expect(deadlocks).toBe(1);
    expect(await count('deadlocked')).toBe(0);
    expect(await recordState('deadlocked')).toBeUndefined();
    expectPoolIdle();
  });

  test('steps run once per attempt and roll back with the transaction', async () => {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store, transactional: true }));
    let stepRuns = 0;
    app.post('/stepped', async (req, res, next) => {
      try {
        const id = await currentIdempotency()?.step('charge', async () => {
          stepRuns++;
          await charge(transactionConnection(req), req.idempotencyKey);
          return `ch_${stepRuns}`;
        });
        if (req.body.fail) throw new Error('after the step');
        res.status(201).json({ id });
      } catch (error) {
        next(error);
      }
    });
    await request(app).post('/stepped').set('Idempotency-Key', 'stepped').send({ fail: true }).expect(500);
    expect(await count('stepped')).toBe(0);
    const ok = await request(app).post('/stepped').set('Idempotency-Key', 'stepped').send({});
    expect(ok.status).toBe(201);
    expect(ok.body).toEqual({ id: 'ch_2' });
    expect(stepRuns).toBe(2);
    expect(await count('stepped')).toBe(1);
    // A committed record is completed: it carries no steps.
    expect((await store.get('stepped'))?.steps).toBeUndefined();
  });

  test('a record released with steps, reused with another body: 422, record and steps unchanged', async () => {
    const key = 'steps-mismatch';
    const first = express();
    first.use(express.json());
    first.use(idempotency({ store }));
    first.post('/charges', async (_req, res) => {
      await currentIdempotency()?.step('charge', async () => 'ch_1');
      res.status(500).json({ failed: true });
    });
    await request(first).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(500);
    const before = await store.get(key);
    expect(before?.state).toBe('released');

    const { app } = expressApp();
    const other = await request(app).post('/charges').set('Idempotency-Key', key).send({ amount: 2 });
    expect(other.status).toBe(422);
    expect(await count(key)).toBe(0);
    const after = await store.get(key);
    expect(after?.state).toBe('released');
    expect(after?.fingerprint).toBe(before?.fingerprint);
    expect(after?.steps).toEqual({ charge: '"ch_1"' });
    expectPoolIdle();
    // The first request's retry resumes its own record.
    await request(app).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(201);
    expect(await count(key)).toBe(1);
  });

  test('transactionConnection outside a transaction throws; without transactional: true it says so', async () => {
    expect(() => transactionConnection({})).toThrow(IdempotencySetupError);
    const app = express();
    app.use(idempotency({ store }));
    app.post('/x', (req, res) => {
      try {
        transactionConnection(req);
        res.status(200).end();
      } catch (error) {
        res.status(500).send((error as Error).message);
      }
    });
    const res = await request(app).post('/x').set('Idempotency-Key', 'no-tx');
    expect(res.text).toMatch(/transactional: true/);
  });
});

describe('transactional mode over HTTP (Fastify)', () => {
  test('the row and the record commit together; a failing handler leaves neither', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { store, transactional: true });
    app.post('/charges', async (req, reply) => {
      await charge(transactionConnection(req), req.idempotencyKey);
      if ((req.body as { fail?: boolean }).fail) throw new Error('boom');
      reply.code(201);
      return { ok: true };
    });
    const inject = (key: string, payload: object) =>
      app.inject({ method: 'POST', url: '/charges', headers: { 'idempotency-key': key }, payload });
    expect((await inject('fy-ok', {})).statusCode).toBe(201);
    expect(await count('fy-ok')).toBe(1);
    expect(await recordState('fy-ok')).toBe('completed');
    expect((await inject('fy-bad', { fail: true })).statusCode).toBe(500);
    expect(await count('fy-bad')).toBe(0);
    expect(await recordState('fy-bad')).toBeUndefined();
    await app.close();
    expectPoolIdle();
  });
});

describe('store.transaction() for consumers', () => {
  test('100 concurrent deliveries of one message: the work runs once, inside the transaction', async () => {
    let runs = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 100 }, () =>
        store
          .transaction('msg-1', { ttl: '1h' }, async (connection) => {
            runs++;
            await charge(connection, 'msg-1');
            await sleep(50);
            return { charged: 9 };
          })
          .then(
            (r) => r.outcome,
            (error: unknown) => (error instanceof IdempotencyInProgressError ? 'in-progress' : String(error)),
          ),
      ),
    );
    expect(runs).toBe(1);
    expect(outcomes.filter((o) => o === 'executed')).toHaveLength(1);
    expect(outcomes.every((o) => o === 'executed' || o === 'replayed' || o === 'in-progress')).toBe(true);
    expect(await count('msg-1')).toBe(1);
    const again = await store.transaction('msg-1', {}, async () => ({ charged: -1 }));
    expect(again).toEqual({ outcome: 'replayed', result: { charged: 9 } });
    expectPoolIdle();
  });

  test('work that throws rolls back its writes and the record; the next delivery runs again', async () => {
    await expect(
      store.transaction('msg-2', {}, async (connection) => {
        await charge(connection, 'msg-2');
        throw new Error('downstream failed');
      }),
    ).rejects.toThrow('downstream failed');
    expect(await count('msg-2')).toBe(0);
    expect(await recordState('msg-2')).toBeUndefined();
    const second = await store.transaction('msg-2', {}, async (connection) => {
      await charge(connection, 'msg-2');
      return 'done';
    });
    expect(second).toEqual({ outcome: 'executed', result: 'done' });
    expect(await count('msg-2')).toBe(1);
  });

  test('a key reused with another fingerprint: IdempotencyMismatchError, the work does not run', async () => {
    await store.transaction('msg-3', { fingerprint: 'F1' }, async () => 'one');
    let runs = 0;
    await expect(
      store.transaction('msg-3', { fingerprint: 'F2' }, async () => {
        runs++;
        return 'two';
      }),
    ).rejects.toBeInstanceOf(IdempotencyMismatchError);
    expect(runs).toBe(0);
    expectPoolIdle();
  });
});
