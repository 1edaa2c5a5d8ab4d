import { randomBytes } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { Duration } from '@oncely/core';
import type { IdempotencyRecord, TransactionalIdempotencyStore } from '@oncely/core/adapter';
import { idempotency } from '@oncely/express';
import express from 'express';
import request from 'supertest';
import { sleep } from './consumers';
import { type AppProcess, fireAtOnce, startAppProcess } from './processes';

// The shared proof of transactional mode through an ORM: one target module per ORM × database, run in this process
// (Express + supertest) and, for the crash test, in a child process that imports the same module.

/** What a request carries in transactional mode (`req.idempotency`). */
export interface OrmSuiteRequest {
  idempotency?: { db: unknown } | undefined;
}

/** A store that runs work in its transactions (a PostgresStore or MySQLStore; here, built with the ORM's). */
export interface OrmSuiteStore<Tx> extends TransactionalIdempotencyStore {
  get(key: string): Promise<IdempotencyRecord | undefined>;
  /** Runs `work` once per key in one transaction of the ORM that also writes the completion. */
  transaction<T>(
    key: string,
    options: { fingerprint?: string; ttl?: Duration },
    work: (tx: Tx) => Promise<T>,
  ): Promise<{ outcome: 'executed' | 'replayed'; result: T }>;
}

/** One ORM on one database, as the suite drives it. */
export interface OrmSuiteTarget<Tx> {
  /** Shown in the test names: `'drizzle on PostgreSQL'`. */
  name: string;
  dialect: 'postgres' | 'mysql';
  store: OrmSuiteStore<Tx>;
  /**
   * Creates the orders table and the store's table (both named after the target's `id`), if missing. Run once, by
   * the test process, before anything else; child processes of the same `id` find them made.
   */
  setup(): Promise<void>;
  /** The business write, through the ORM's own API on its transaction (never raw SQL): one order row for `key`. */
  insertOrder(tx: Tx, key: string): Promise<void>;
  /** Committed order rows for `key`, or in all, read outside any transaction. */
  countOrders(key?: string): Promise<number>;
  /** The integration's accessor: the request's transaction, as the ORM's type. */
  transactionOf(request: OrmSuiteRequest): Tx;
  /** Drops what `setup` made (the test process calls it last, before `close`). */
  drop(): Promise<void>;
  /** Ends the target's pools and clients: nothing may be left open. */
  close(): Promise<void>;
}

export interface OrmSuiteTargetOptions {
  /** Unique per suite run, and the same in its child processes: every table the target makes is named after it. */
  id: string;
}

/** What a target module exports (one module per ORM × database, e.g. `test/targets/drizzle-pg.ts`). */
export interface OrmSuiteTargetModule<Tx = unknown> {
  createTarget(options: OrmSuiteTargetOptions): Promise<OrmSuiteTarget<Tx>>;
}

export interface OrmSuiteOptions {
  /** Requests of the concurrency test (over `keys` keys). Default: 500 over 100. */
  requests?: number;
  keys?: number;
}

/** A short table-name-safe id: letters and digits, starting with a letter. */
export function ormSuiteId(): string {
  return `t${randomBytes(5).toString('hex')}`;
}

/** Loads a target module by absolute path (in jest: mapped like any import; in a child: through tsx). */
export async function loadOrmTarget(targetModule: string, id: string): Promise<OrmSuiteTarget<unknown>> {
  const loaded = (await import(targetModule)) as Partial<OrmSuiteTargetModule>;
  if (typeof loaded.createTarget !== 'function')
    throw new Error(`${targetModule} does not export createTarget(options)`);
  return loaded.createTarget({ id });
}

/** How the handler of both apps behaves, from the request body. */
export interface OrmOrderBody {
  /** Throw after the insert, so that the transaction rolls back. */
  fail?: boolean;
  /** Wait this long after the insert (widens the window in which duplicates arrive). */
  holdMs?: number;
}

/**
 * The app both processes serve: `POST /orders` inserts one order through the ORM on the request's transaction,
 * then answers 201 `{ key, run }` (`run` counts this process's executions), or fails as the body asks.
 * `afterInsert` runs between the insert and the answer (the child prints and hangs there, to be killed).
 */
export function ormSuiteApp(
  target: OrmSuiteTarget<unknown>,
  afterInsert: (key: string) => Promise<void> = async () => {},
): { app: express.Express; runs: Map<string, number> } {
  const runs = new Map<string, number>();
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: target.store, transactional: true }));
  app.post('/orders', async (req, res, next) => {
    try {
      const key = req.idempotencyKey ?? '';
      const run = (runs.get(key) ?? 0) + 1;
      runs.set(key, run);
      await target.insertOrder(target.transactionOf(req), key);
      await afterInsert(key);
      const body = (req.body ?? {}) as OrmOrderBody;
      if (body.holdMs !== undefined) await sleep(body.holdMs);
      if (body.fail === true) throw new Error('the handler failed after its insert');
      res.status(201).json({ key, run });
    } catch (error) {
      next(error);
    }
  });
  return { app, runs };
}

/**
 * Runs the ORM suite on the target `targetModule` exports (an absolute path): the handler's insert and the
 * idempotency record commit together, a failure after the insert rolls both back, a process SIGKILLed between the
 * insert and the commit leaves nothing, concurrent duplicates insert once, and `store.transaction()` likewise.
 */
export function ormSuite(targetModule: string, options: OrmSuiteOptions = {}): void {
  const id = ormSuiteId();
  let target: OrmSuiteTarget<unknown>;
  let app: express.Express;
  let runs: Map<string, number>;
  const key = (name: string) => `${id}-${name}`;
  const post = (k: string, body: OrmOrderBody = {}) =>
    request(app).post('/orders').set('Idempotency-Key', k).send(body);

  describe(`ORM suite: ${targetModule.split(/[\\/]/).slice(-1)[0]}`, () => {
    beforeAll(async () => {
      target = await loadOrmTarget(targetModule, id);
      await target.setup();
      ({ app, runs } = ormSuiteApp(target));
    });
    afterAll(async () => {
      if (target === undefined) return;
      try {
        await target.drop();
      } finally {
        await target.close();
      }
    });

    test('the handler’s insert through the ORM and the record commit together; the retry is a replay', async () => {
      const k = key('together');
      const first = await post(k);
      expect(first.status).toBe(201);
      expect(first.body).toEqual({ key: k, run: 1 });
      expect(await target.countOrders(k)).toBe(1);
      expect((await target.store.get(k))?.state).toBe('completed');
      const replay = await post(k);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual({ key: k, run: 1 });
      expect(runs.get(k)).toBe(1);
      expect(await target.countOrders(k)).toBe(1);
    });

    test('a failure after the insert rolls back the row and the record; the retry runs again', async () => {
      const k = key('fails');
      expect((await post(k, { fail: true })).status).toBe(500);
      expect(await target.countOrders(k)).toBe(0);
      expect(await target.store.get(k)).toBeUndefined();
      const retry = await post(k);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(runs.get(k)).toBe(2);
      expect(await target.countOrders(k)).toBe(1);
    });

    test('the accessor refuses a request with no transaction', () => {
      expect(() => target.transactionOf({})).toThrow(/transactional: true/);
    });

    describe('a process SIGKILLed between the insert and the commit', () => {
      let child: AppProcess | undefined;
      afterAll(() => child?.kill());

      test('leaves no row and no record; the retry runs once', async () => {
        const k = key('killed');
        child = await startAppProcess(join(__dirname, 'orm-suite-child.ts'), {
          ORM_TARGET: targetModule,
          ORM_TARGET_ID: id,
        });
        const inserted = child.waitForLine((line) => line === `inserted ${k}`);
        // The child never answers: the request fails when the process dies.
        const sent = request(child.url)
          .post('/orders')
          .set('Idempotency-Key', k)
          .send({})
          .then(
            () => 'answered',
            () => 'cut',
          );
        await inserted;
        await child.kill();
        expect(await sent).toBe('cut');
        // The insert was made and never committed: no row, no record (a write outside the transaction shows here).
        expect(await target.countOrders(k)).toBe(0);
        expect(await target.store.get(k)).toBeUndefined();
        // The server rolls back once it sees the connection gone; until then a retry meets the held key (409).
        let retry = await post(k);
        for (let i = 0; i < 100 && retry.status === 409; i++) {
          await sleep(100);
          retry = await post(k);
        }
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(runs.get(k)).toBe(1);
        expect(await target.countOrders(k)).toBe(1);
        expect((await post(k)).headers['idempotent-replayed']).toBe('true');
        expect(runs.get(k)).toBe(1);
      });
    });

    test('concurrent requests over few keys insert exactly one row per key, with no 5xx', async () => {
      const total = options.requests ?? 500;
      const keyCount = options.keys ?? 100;
      const keys = Array.from({ length: keyCount }, (_, i) => key(`many-${i}`));
      const server: Server = await new Promise((resolve) => {
        const s = app.listen(0, '127.0.0.1', () => resolve(s));
      });
      try {
        const { port } = server.address() as AddressInfo;
        const results = await fireAtOnce({
          urls: [`http://127.0.0.1:${port}`],
          path: '/orders',
          keys,
          total,
          body: JSON.stringify({ holdMs: 20 }),
          maxSockets: 256,
        });
        expect(results.filter((r) => r.status >= 500)).toEqual([]);
        const originals = results.filter((r) => r.status === 201 && !r.replayed);
        const others = results.filter((r) => r.replayed || r.status === 409);
        expect(originals).toHaveLength(keyCount);
        expect(originals.length + others.length).toBe(total);
        const bodyOf = new Map(originals.map((r) => [r.key, r.body]));
        for (const r of results.filter((r) => r.replayed)) expect(r.body).toBe(bodyOf.get(r.key));
        for (const k of keys) expect(runs.get(k)).toBe(1);
        let rows = 0;
        for (const k of keys) rows += await target.countOrders(k);
        expect(rows).toBe(keyCount);
      } finally {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    });

    test('store.transaction() commits the ORM’s write with the completion, once per key', async () => {
      const k = key('consumer');
      let executions = 0;
      const workFor = (orderKey: string) => async (tx: unknown) => {
        executions++;
        await target.insertOrder(tx, orderKey);
        return { executions };
      };
      const work = workFor(k);
      expect(await target.store.transaction(k, {}, work)).toEqual({
        outcome: 'executed',
        result: { executions: 1 },
      });
      expect(await target.store.transaction(k, {}, work)).toEqual({
        outcome: 'replayed',
        result: { executions: 1 },
      });
      expect(executions).toBe(1);
      expect(await target.countOrders(k)).toBe(1);

      const failing = key('consumer-fails');
      await expect(
        target.store.transaction(failing, {}, async (tx) => {
          await target.insertOrder(tx, failing);
          throw new Error('the work failed after its insert');
        }),
      ).rejects.toThrow('the work failed after its insert');
      expect(await target.countOrders(failing)).toBe(0);
      expect((await target.store.transaction(failing, {}, workFor(failing))).outcome).toBe('executed');
      expect(await target.countOrders(failing)).toBe(1);
    });
  });
}
