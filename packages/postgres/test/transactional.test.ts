/**
 * @services postgres
 */
import { join } from 'node:path';
import { IdempotencyInProgressError, IdempotencySetupError, OncelyError } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import { startAppProcess } from '@oncely/testing';
import express from 'express';
import Fastify from 'fastify';
import request from 'supertest';
import { PostgresStore, transactionClient } from '../src';
import { connectionString, testSchema } from './helpers';

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

const count = async (key: string) =>
  Number(
    (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
      .count,
  );
const recordState = async (key: string) =>
  (await db.pool().query(`SELECT state FROM "${db.schema}".oncely_idempotency WHERE key = $1`, [key])).rows[0]
    ?.state as string | undefined;

type Gate = { wait: Promise<void>; open: () => void };
function gate(): Gate {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { wait, open };
}

function expressApp(options: { wait?: boolean } = {}) {
  const gates = new Map<string, Gate>();
  const app = express();
  app.use(express.json());
  app.use(
    idempotency({ store, transactional: true, ...(options.wait ? { inProgress: { wait: '10s' } } : {}) }),
  );
  app.post('/charges', async (req, res, next) => {
    try {
      const client = transactionClient(req);
      await client.query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, [req.idempotencyKey]);
      await gates.get(req.idempotencyKey ?? '')?.wait;
      if (req.body.fail) throw new Error('handler failed after its write');
      if (req.body.breakCommit) await client.query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
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
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ charged: 5 });
    expect(await count('together')).toBe(1);
  });

  test('a handler that fails after writing leaves neither row nor record; the retry runs once', async () => {
    const { app } = expressApp();
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'fails')
      .send({ amount: 1, fail: true })
      .expect(500);
    expect(await count('fails')).toBe(0);
    expect(await recordState('fails')).toBeUndefined();
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'fails')
      .send({ amount: 1, fail: true })
      .expect(500);
    expect(await count('fails')).toBe(0);
  });

  test('res.flushHeaders() sends nothing before the commit: a handler that then fails rolls back, the retry runs', async () => {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store, transactional: true }));
    let runs = 0;
    app.post('/flushed', async (req, res) => {
      runs++;
      res.flushHeaders();
      await transactionClient(req).query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, [
        req.idempotencyKey,
      ]);
      if (req.body.breakCommit) {
        await transactionClient(req).query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
        res.status(201).json({ ok: true });
        return;
      }
      res.destroy(new Error('failed after flushing the head'));
    });
    const attempt = () =>
      request(app)
        .post('/flushed')
        .set('Idempotency-Key', 'flushed')
        .send({})
        .then(
          () => 'answered',
          () => 'closed',
        );
    expect(await attempt()).toBe('closed');
    await sleep(100);
    expect(await count('flushed')).toBe(0);
    expect(await recordState('flushed')).toBeUndefined();
    expect(await attempt()).toBe('closed');
    expect(runs).toBe(2);
    expect(await count('flushed')).toBe(0);

    // The head was held too: a commit that fails still turns the answer into a 500, and nothing is kept.
    const broken = await request(app)
      .post('/flushed')
      .set('Idempotency-Key', 'flushed-broken')
      .send({ breakCommit: true });
    expect(broken.status).toBe(500);
    expect(await count('flushed-broken')).toBe(0);
  });

  test('a commit that fails turns the handler’s 201 into a 500 problem, and nothing is kept', async () => {
    const { app } = expressApp();
    const res = await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'commit-fails')
      .send({ amount: 1, breakCommit: true });
    expect(res.status).toBe(500);
    expect(res.headers['content-type']).toMatch(/problem\+json/);
    expect(res.body.type).toBe('https://oncely.dev/problems/transaction-failed');
    expect(await count('commit-fails')).toBe(0);
    expect(await recordState('commit-fails')).toBeUndefined();
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
    await sleep(200);
    const second = await request(app).post('/charges').set('Idempotency-Key', 'open-tx').send({ amount: 2 });
    expect(second.status).toBe(409);
    // The first transaction is still open: its row is not visible to anyone else yet.
    expect(await count('open-tx')).toBe(0);
    g.open();
    expect((await first).status).toBe(201);
    expect(await count('open-tx')).toBe(1);
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
    await sleep(200);
    const second = request(app)
      .post('/charges')
      .set('Idempotency-Key', 'wait-tx')
      .send({ amount: 3 })
      .then((r) => r);
    await sleep(200);
    g.open();
    const [a, b] = await Promise.all([first, second]);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(await count('wait-tx')).toBe(1);
  });

  test('transactionClient outside a transaction throws an OncelyError', () => {
    expect(() => transactionClient({})).toThrow(IdempotencySetupError);
    expect(() => transactionClient({})).toThrow(OncelyError);
  });

  test('without transactional: true the handler gets no client, and says so', async () => {
    const app = express();
    app.use(idempotency({ store }));
    app.post('/x', (req, res) => {
      try {
        transactionClient(req);
        res.status(200).end();
      } catch (error) {
        res.status(500).send((error as Error).message);
      }
    });
    const res = await request(app).post('/x').set('Idempotency-Key', 'no-tx');
    expect(res.text).toMatch(/transactional: true/);
  });

  test('a request without a key is a 400 key-missing problem: the handler, which needs the transaction, never runs', async () => {
    // The shape of the package README's example: a route-level middleware, no `required`.
    const app = express();
    app.use(express.json());
    let runs = 0;
    app.post('/orders', idempotency({ store, transactional: true }), async (req, res) => {
      runs++;
      await transactionClient(req).query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, ['keyless']);
      res.status(201).json({ ok: true });
    });
    const res = await request(app).post('/orders').send({ item: 'book' });
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
    expect(res.body.type).toMatch(/key-missing/);
    expect(res.text).not.toMatch(/oncely\/postgres|transaction/);
    expect(runs).toBe(0);
    expect(await count('keyless')).toBe(0);
  });

  test('with required: false, a request without a key runs outside any transaction (req.idempotency unset)', async () => {
    const app = express();
    app.use(express.json());
    app.post('/orders', idempotency({ store, transactional: true, required: false }), async (req, res) => {
      // The documented fallback for keyless requests: the pool, without the record.
      const client = req.idempotency === undefined ? db.pool() : transactionClient(req);
      await client.query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, ['keyless-fallback']);
      res.status(201).json({ transactional: req.idempotency !== undefined });
    });
    const res = await request(app).post('/orders').send({});
    expect(res.status).toBe(201);
    expect(res.body).toEqual({ transactional: false });
    expect(await count('keyless-fallback')).toBe(1);
  });

  test('transactional: true with a store that cannot do transactions is refused at construction', () => {
    expect(() => idempotency({ transactional: true })).toThrow(/option "transactional"/);
    expect(() => idempotency({ store, transactional: true, onStoreError: 'fail-open' })).toThrow(
      /option "onStoreError"/,
    );
  });
});

describe('transactional mode over HTTP (Fastify)', () => {
  test('the row and the record commit together; a failing handler leaves neither', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { store, transactional: true });
    app.post('/charges', async (req, reply) => {
      await transactionClient(req).query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, [
        req.idempotencyKey,
      ]);
      if ((req.body as { fail?: boolean }).fail) throw new Error('boom');
      reply.code(201);
      return { ok: true };
    });
    const ok = await app.inject({
      method: 'POST',
      url: '/charges',
      headers: { 'idempotency-key': 'fy-ok' },
      payload: {},
    });
    expect(ok.statusCode).toBe(201);
    expect(await count('fy-ok')).toBe(1);
    expect(await recordState('fy-ok')).toBe('completed');
    const bad = await app.inject({
      method: 'POST',
      url: '/charges',
      headers: { 'idempotency-key': 'fy-bad' },
      payload: { fail: true },
    });
    expect(bad.statusCode).toBe(500);
    expect(await count('fy-bad')).toBe(0);
    expect(await recordState('fy-bad')).toBeUndefined();
    await app.close();
  });
});

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
      expect(await count(key)).toBe(0);
      expect(await recordState(key)).toBeUndefined();

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
        expect(await count(key)).toBe(1);
      } finally {
        await survivor.kill();
      }
    },
  );
});

describe('store.transaction() for consumers', () => {
  test('100 concurrent deliveries of one message: the work runs once, inside the transaction', async () => {
    let runs = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 100 }, () =>
        store
          .transaction('msg-1', { ttl: '1h' }, async (client) => {
            runs++;
            await client.query(`INSERT INTO "${db.schema}".charges (key) VALUES ('msg-1')`);
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
  });

  test('work that throws rolls back its writes and the record; the next delivery runs again', async () => {
    await expect(
      store.transaction('msg-2', {}, async (client) => {
        await client.query(`INSERT INTO "${db.schema}".charges (key) VALUES ('msg-2')`);
        throw new Error('downstream failed');
      }),
    ).rejects.toThrow('downstream failed');
    expect(await count('msg-2')).toBe(0);
    const second = await store.transaction('msg-2', {}, async () => 'done');
    expect(second).toEqual({ outcome: 'executed', result: 'done' });
  });
});
