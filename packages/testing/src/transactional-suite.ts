import {
  currentIdempotency,
  IdempotencyInProgressError,
  IdempotencyMismatchError,
  IdempotencySetupError,
  OncelyError,
} from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import request from 'supertest';
import { sleep } from './consumers';
import type { OrmSuiteRequest, OrmSuiteStore } from './orm-suite';
import { type Gate, gate } from './outages';

// The shared proof of a SQL store's transactional mode over HTTP and of its store.transaction(): the handler's row and
// the record commit together or not at all. Each store package runs it on its own driver, tables and server.

/** What a request carries in transactional mode (`req.idempotency`). */
export type TransactionalSuiteRequest = OrmSuiteRequest;

/** A store that runs the handler in its transaction (a MySQLStore or PostgresStore), as the suite uses it. */
export type TransactionalSuiteStore<Tx> = OrmSuiteStore<Tx>;

/** What differs between two stores: the store, the driver's transaction, and the SQL of the checks. */
export interface TransactionalSuiteTarget<Tx> {
  /** Migrated, on the file's own table or schema, with a table of charges beside it. */
  store: TransactionalSuiteStore<Tx>;
  /** The package's accessor (`transactionConnection`, `transactionClient`): the request's transaction. */
  transactionOf(request: TransactionalSuiteRequest): Tx;
  /** The business write: one charge row for `key`, on `tx`. */
  charge(tx: Tx, key: string): Promise<unknown>;
  /** The same write outside any transaction (on the pool): what a keyless request falls back to. */
  chargeOutside(key: string): Promise<unknown>;
  /** Committed charge rows for `key`, read outside any transaction. */
  count(key: string): Promise<number>;
  /** The record's `state` column for `key`, read with SQL; undefined when there is no row. */
  recordState(key: string): Promise<string | undefined>;
  /** Makes the coming COMMIT of `tx` fail (the suite's `commitFailure` says how, in the test's name). */
  breakCommit(tx: Tx): Promise<void>;
  /** Checks that no connection is left checked out of the store's pool, where the driver shows it. */
  expectIdle?(): void;
}

/** How the handler of `POST /charges` behaves, from the request body. */
export interface TransactionalChargeBody {
  amount?: number;
  /** Throw after the write, so that the transaction rolls back. */
  fail?: boolean;
  /** Make the commit fail after the handler has answered 201 (`breakCommit`). */
  breakCommit?: boolean;
}

/**
 * An Express app in transactional mode: `POST /charges` writes a charge on the request's transaction, holds at the
 * key's gate if there is one, then fails or answers 201 `{ charged: amount }` (header `x-charge: yes`) as the body asks. `store` replaces the
 * target's (another pool), `wait` makes duplicates wait for the first instead of getting 409.
 */
export function transactionalSuiteApp<Tx>(
  target: TransactionalSuiteTarget<Tx>,
  options: { wait?: boolean; store?: TransactionalSuiteStore<Tx> } = {},
): { app: express.Express; gates: Map<string, Gate> } {
  const gates = new Map<string, Gate>();
  const app = express();
  app.use(express.json());
  app.use(
    idempotency({
      store: options.store ?? target.store,
      transactional: true,
      ...(options.wait ? { inProgress: { wait: '10s' } } : {}),
    }),
  );
  app.post('/charges', async (req, res, next) => {
    try {
      const body = (req.body ?? {}) as TransactionalChargeBody;
      const tx = target.transactionOf(req);
      const key = req.idempotencyKey ?? '';
      await target.charge(tx, key);
      const held = gates.get(key);
      held?.enter();
      await held?.wait;
      if (body.fail === true) throw new Error('handler failed after its write');
      if (body.breakCommit === true) await target.breakCommit(tx);
      res.status(201).set('x-charge', 'yes').json({ charged: body.amount });
    } catch (error) {
      next(error);
    }
  });
  return { app, gates };
}

export interface TransactionalSuiteOptions<Tx> {
  /** Shown in the describe names: `'MySQLStore'`. */
  name: string;
  /** How the target's `breakCommit` makes the commit fail, shown in that test's name. */
  commitFailure: string;
  /** Called in each test, so that the test file may build the target in its `beforeAll`. */
  target: () => TransactionalSuiteTarget<Tx>;
}

/**
 * Runs the transactional suite: over Express and Fastify, the handler's row and the record commit together, a failure
 * or a failed commit keeps neither, a duplicate gets 409 or waits for the commit; `store.transaction()` runs the work
 * once per key. The keys are fixed names: the target's tables must be the test file's own.
 */
export function transactionalSuite<Tx>({
  name,
  commitFailure,
  target: t,
}: TransactionalSuiteOptions<Tx>): void {
  const idle = () => t().expectIdle?.();
  const post = (app: express.Express, key: string, body: TransactionalChargeBody) =>
    request(app).post('/charges').set('Idempotency-Key', key).send(body);

  describe(`${name}: transactional mode over HTTP (Express)`, () => {
    test('the business row and the record commit together; the replay comes from the record', async () => {
      const { app } = transactionalSuiteApp(t());
      await post(app, 'together', { amount: 5 }).expect(201);
      expect(await t().count('together')).toBe(1);
      expect(await t().recordState('together')).toBe('completed');
      const replay = await post(app, 'together', { amount: 5 });
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['x-charge']).toBe('yes');
      expect(replay.body).toEqual({ charged: 5 });
      expect(await t().count('together')).toBe(1);
      // The store reads back what it committed, whatever the driver hands it (a Buffer for the body).
      const record = await t().store.get('together');
      expect(record?.state).toBe('completed');
      expect(record?.response?.status).toBe(201);
      expect(Buffer.isBuffer(record?.response?.body)).toBe(true);
      expect(JSON.parse(String(record?.response?.body))).toEqual({ charged: 5 });
      idle();
    });

    test('a handler that fails after writing leaves neither row nor record; each retry runs again', async () => {
      const { app } = transactionalSuiteApp(t());
      await post(app, 'fails', { amount: 1, fail: true }).expect(500);
      expect(await t().count('fails')).toBe(0);
      expect(await t().recordState('fails')).toBeUndefined();
      await post(app, 'fails', { amount: 1, fail: true }).expect(500);
      expect(await t().count('fails')).toBe(0);
      expect(await t().recordState('fails')).toBeUndefined();
      await post(app, 'fails', { amount: 1 }).expect(201);
      expect(await t().count('fails')).toBe(1);
      idle();
    });

    test(`a commit that fails (${commitFailure}): the handler's 201 becomes a 500 problem, nothing is kept, the retry runs`, async () => {
      const { app } = transactionalSuiteApp(t());
      const res = await post(app, 'commit-fails', { amount: 1, breakCommit: true });
      expect(res.status).toBe(500);
      expect(res.headers['content-type']).toMatch(/problem\+json/);
      expect(res.body.type).toBe('https://oncely.dev/problems/transaction-failed');
      expect(await t().count('commit-fails')).toBe(0);
      expect(await t().recordState('commit-fails')).toBeUndefined();
      await post(app, 'commit-fails', { amount: 1 }).expect(201);
      expect(await t().count('commit-fails')).toBe(1);
      idle();
    });

    test('res.flushHeaders() sends nothing before the commit: a handler that then fails rolls back, the retry runs', async () => {
      const app = express();
      app.use(express.json());
      app.use(idempotency({ store: t().store, transactional: true }));
      let runs = 0;
      app.post('/flushed', async (req, res) => {
        runs++;
        res.flushHeaders();
        const tx = t().transactionOf(req);
        await t().charge(tx, req.idempotencyKey ?? '');
        if (req.body.breakCommit) {
          await t().breakCommit(tx);
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
      expect(await t().count('flushed')).toBe(0);
      expect(await t().recordState('flushed')).toBeUndefined();
      expect(await attempt()).toBe('closed');
      expect(runs).toBe(2);
      expect(await t().count('flushed')).toBe(0);

      // The head was held too: a commit that fails still turns the answer into a 500, and nothing is kept.
      const broken = await request(app)
        .post('/flushed')
        .set('Idempotency-Key', 'flushed-broken')
        .send({ breakCommit: true });
      expect(broken.status).toBe(500);
      expect(await t().count('flushed-broken')).toBe(0);
    });

    test('a concurrent duplicate gets 409 at once while the first transaction is open', async () => {
      const { app, gates } = transactionalSuiteApp(t());
      const g = gate();
      gates.set('open-tx', g);
      const first = post(app, 'open-tx', { amount: 2 }).then((r) => r);
      await g.entered;
      // Answered while the first still holds its row: a duplicate waiting on the row would get the replay instead.
      const second = await post(app, 'open-tx', { amount: 2 });
      expect(second.status).toBe(409);
      expect(second.headers['retry-after']).toBeDefined();
      // The first transaction is still open: its row is not visible to anyone else yet.
      expect(await t().count('open-tx')).toBe(0);
      g.open();
      expect((await first).status).toBe(201);
      expect(await t().count('open-tx')).toBe(1);
      idle();
    });

    test('in wait mode, the duplicate waits for the commit and gets the replay', async () => {
      const { app, gates } = transactionalSuiteApp(t(), { wait: true });
      const g = gate();
      gates.set('wait-tx', g);
      const first = post(app, 'wait-tx', { amount: 3 }).then((r) => r);
      await g.entered;
      const second = post(app, 'wait-tx', { amount: 3 }).then((r) => r);
      // Time for the duplicate to arrive and start waiting; were it answered before the commit, it would not be a replay.
      await sleep(300);
      g.open();
      const [a, b] = await Promise.all([first, second]);
      expect(a.status).toBe(201);
      expect(b.status).toBe(201);
      expect(b.headers['idempotent-replayed']).toBe('true');
      expect(await t().count('wait-tx')).toBe(1);
    });

    test('steps run once per attempt and roll back with the transaction', async () => {
      const app = express();
      app.use(express.json());
      app.use(idempotency({ store: t().store, transactional: true }));
      let stepRuns = 0;
      app.post('/stepped', async (req, res, next) => {
        try {
          const id = await currentIdempotency()?.step('charge', async () => {
            stepRuns++;
            await t().charge(t().transactionOf(req), req.idempotencyKey ?? '');
            return `ch_${stepRuns}`;
          });
          if (req.body.fail) throw new Error('after the step');
          res.status(201).json({ id });
        } catch (error) {
          next(error);
        }
      });
      await request(app).post('/stepped').set('Idempotency-Key', 'stepped').send({ fail: true }).expect(500);
      expect(await t().count('stepped')).toBe(0);
      const ok = await request(app).post('/stepped').set('Idempotency-Key', 'stepped').send({});
      expect(ok.status).toBe(201);
      expect(ok.body).toEqual({ id: 'ch_2' });
      expect(stepRuns).toBe(2);
      expect(await t().count('stepped')).toBe(1);
      // A committed record is completed: it carries no steps.
      expect((await t().store.get('stepped'))?.steps).toBeUndefined();
    });

    test('a record released with steps, reused with another body: 422, record and steps unchanged', async () => {
      const key = 'steps-mismatch';
      const first = express();
      first.use(express.json());
      first.use(idempotency({ store: t().store }));
      first.post('/charges', async (_req, res) => {
        await currentIdempotency()?.step('charge', async () => 'ch_1');
        res.status(500).json({ failed: true });
      });
      await request(first).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(500);
      const before = await t().store.get(key);
      expect(before?.state).toBe('released');

      const { app } = transactionalSuiteApp(t());
      const other = await post(app, key, { amount: 2 });
      expect(other.status).toBe(422);
      expect(await t().count(key)).toBe(0);
      const after = await t().store.get(key);
      expect(after?.state).toBe('released');
      expect(after?.fingerprint).toBe(before?.fingerprint);
      expect(after?.steps).toEqual({ charge: '"ch_1"' });
      idle();
      // The first request's retry resumes its own record.
      await post(app, key, { amount: 1 }).expect(201);
      expect(await t().count(key)).toBe(1);
    });

    test('the accessor outside a transaction throws an IdempotencySetupError, an OncelyError', () => {
      expect(() => t().transactionOf({})).toThrow(IdempotencySetupError);
      expect(() => t().transactionOf({})).toThrow(OncelyError);
    });

    test('without transactional: true the handler gets no transaction, and the accessor says so', async () => {
      const app = express();
      app.use(idempotency({ store: t().store }));
      app.post('/x', (req, res) => {
        try {
          t().transactionOf(req);
          res.status(200).end();
        } catch (error) {
          res.status(500).send((error as Error).message);
        }
      });
      const res = await request(app).post('/x').set('Idempotency-Key', 'no-tx');
      expect(res.text).toMatch(/transactional: true/);
    });

    test('a request without a key is a 400 key-missing problem: the handler, which needs the transaction, never runs', async () => {
      // The shape of the packages' README example: a route-level middleware, no `required`.
      const app = express();
      app.use(express.json());
      let runs = 0;
      app.post('/orders', idempotency({ store: t().store, transactional: true }), async (req, res) => {
        runs++;
        await t().charge(t().transactionOf(req), 'keyless');
        res.status(201).json({ ok: true });
      });
      const res = await request(app).post('/orders').send({ item: 'book' });
      expect(res.status).toBe(400);
      expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
      expect(res.body.type).toMatch(/key-missing/);
      expect(res.text).not.toMatch(/oncely\/|transaction/);
      expect(runs).toBe(0);
      expect(await t().count('keyless')).toBe(0);
    });

    test('with required: false, a request without a key runs outside any transaction (req.idempotency unset)', async () => {
      const app = express();
      app.use(express.json());
      app.post(
        '/orders',
        idempotency({ store: t().store, transactional: true, required: false }),
        async (req, res) => {
          // The documented fallback for keyless requests: the pool, without the record.
          if (req.idempotency === undefined) await t().chargeOutside('keyless-fallback');
          else await t().charge(t().transactionOf(req), 'keyless-fallback');
          res.status(201).json({ transactional: req.idempotency !== undefined });
        },
      );
      const res = await request(app).post('/orders').send({});
      expect(res.status).toBe(201);
      expect(res.body).toEqual({ transactional: false });
      expect(await t().count('keyless-fallback')).toBe(1);
    });

    test('transactional: true with a store that cannot do transactions is refused at construction', () => {
      expect(() => idempotency({ transactional: true })).toThrow(/option "transactional"/);
      expect(() => idempotency({ store: t().store, transactional: true, onStoreError: 'fail-open' })).toThrow(
        /option "onStoreError"/,
      );
    });
  });

  describe(`${name}: transactional mode over HTTP (Fastify)`, () => {
    test('the row and the record commit together; a failing handler leaves neither', async () => {
      // Loaded here, not at the top: every test file that imports @oncely/testing would load Fastify otherwise.
      const { default: Fastify } = await import('fastify');
      const { idempotencyPlugin } = await import('@oncely/fastify');
      const app = Fastify();
      await app.register(idempotencyPlugin, { store: t().store, transactional: true });
      app.post('/charges', async (req, reply) => {
        await t().charge(t().transactionOf(req), req.idempotencyKey ?? '');
        if ((req.body as { fail?: boolean }).fail) throw new Error('boom');
        reply.code(201);
        return { ok: true };
      });
      const inject = (key: string, payload: object) =>
        app.inject({ method: 'POST', url: '/charges', headers: { 'idempotency-key': key }, payload });
      expect((await inject('fy-ok', {})).statusCode).toBe(201);
      expect(await t().count('fy-ok')).toBe(1);
      expect(await t().recordState('fy-ok')).toBe('completed');
      expect((await inject('fy-bad', { fail: true })).statusCode).toBe(500);
      expect(await t().count('fy-bad')).toBe(0);
      expect(await t().recordState('fy-bad')).toBeUndefined();
      await app.close();
      idle();
    });
  });

  describe(`${name}: store.transaction() for consumers`, () => {
    test('100 concurrent deliveries of one message: the work runs once, inside the transaction', async () => {
      let runs = 0;
      const outcomes = await Promise.all(
        Array.from({ length: 100 }, () =>
          t()
            .store.transaction('msg-1', { ttl: '1h' }, async (tx) => {
              runs++;
              await t().charge(tx, 'msg-1');
              await sleep(50);
              return { charged: 9 };
            })
            .then(
              (r) => r.outcome,
              (error: unknown) =>
                error instanceof IdempotencyInProgressError ? 'in-progress' : String(error),
            ),
        ),
      );
      expect(runs).toBe(1);
      expect(outcomes.filter((o) => o === 'executed')).toHaveLength(1);
      expect(outcomes.every((o) => o === 'executed' || o === 'replayed' || o === 'in-progress')).toBe(true);
      expect(await t().count('msg-1')).toBe(1);
      const again = await t().store.transaction('msg-1', {}, async () => ({ charged: -1 }));
      expect(again).toEqual({ outcome: 'replayed', result: { charged: 9 } });
      idle();
    });

    test('work that throws rolls back its writes and the record; the next delivery runs again', async () => {
      await expect(
        t().store.transaction('msg-2', {}, async (tx) => {
          await t().charge(tx, 'msg-2');
          throw new Error('downstream failed');
        }),
      ).rejects.toThrow('downstream failed');
      expect(await t().count('msg-2')).toBe(0);
      expect(await t().recordState('msg-2')).toBeUndefined();
      const second = await t().store.transaction('msg-2', {}, async (tx) => {
        await t().charge(tx, 'msg-2');
        return 'done';
      });
      expect(second).toEqual({ outcome: 'executed', result: 'done' });
      expect(await t().count('msg-2')).toBe(1);
    });

    test('a key reused with another fingerprint: IdempotencyMismatchError, the work does not run', async () => {
      await t().store.transaction('msg-3', { fingerprint: 'F1' }, async () => 'one');
      let runs = 0;
      await expect(
        t().store.transaction('msg-3', { fingerprint: 'F2' }, async () => {
          runs++;
          return 'two';
        }),
      ).rejects.toBeInstanceOf(IdempotencyMismatchError);
      expect(runs).toBe(0);
      idle();
    });
  });
}
