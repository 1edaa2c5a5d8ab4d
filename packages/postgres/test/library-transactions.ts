import { IdempotencyInProgressError } from '@oncely/core';
import { transactionOfRequest } from '@oncely/core/adapter';
import { idempotency } from '@oncely/express';
import express from 'express';
import request from 'supertest';
import type { PostgresStore } from '../src';

/** What a transactional test needs of a database library: a store built on it, and a write through its transaction. */
export interface LibraryUnderTest<Tx> {
  store: () => PostgresStore<Tx>;
  /** Inserts a row of `charges` for `key` through the handler's transaction. */
  insert: (tx: Tx, key: string) => Promise<void>;
  /** Writes, through the transaction, a row that a DEFERRABLE INITIALLY DEFERRED constraint refuses at COMMIT. */
  breakCommit: (tx: Tx) => Promise<void>;
  /** Counts committed rows of `charges` for `key`, and reads the key's record state, outside any transaction. */
  count: (key: string) => Promise<number>;
  recordState: (key: string) => Promise<string | undefined>;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The transactional mode's promises, for a store whose transactions go through a library (`transactions`, or
 * postgres.js's own): the handler's writes and the record commit together, a failure rolls both back, and a
 * duplicate of an open transaction is told so at once.
 */
export function describeLibraryTransactions<Tx>(name: string, library: LibraryUnderTest<Tx>): void {
  function app(gates: Map<string, Promise<void>>) {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store: library.store(), transactional: true }));
    app.post('/charges', async (req, res, next) => {
      try {
        const tx = transactionOfRequest<Tx>(req, 'test');
        await library.insert(tx, req.idempotencyKey ?? '');
        await gates.get(req.idempotencyKey ?? '');
        if (req.body.fail) throw new Error('handler failed after its write');
        if (req.body.breakCommit) await library.breakCommit(tx);
        res.status(201).set('x-charge', 'yes').json({ charged: req.body.amount });
      } catch (error) {
        next(error);
      }
    });
    return app;
  }

  describe(`transactional mode through ${name}`, () => {
    test('the handler’s row and the record commit together; the replay comes from the record', async () => {
      const server = app(new Map());
      await request(server)
        .post('/charges')
        .set('Idempotency-Key', 'together')
        .send({ amount: 5 })
        .expect(201);
      expect(await library.count('together')).toBe(1);
      expect(await library.recordState('together')).toBe('completed');
      const replay = await request(server)
        .post('/charges')
        .set('Idempotency-Key', 'together')
        .send({ amount: 5 });
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['x-charge']).toBe('yes');
      expect(replay.body).toEqual({ charged: 5 });
      expect(await library.count('together')).toBe(1);
      const record = await library.store().get('together');
      expect(record?.state).toBe('completed');
      expect(record?.response?.status).toBe(201);
      expect(Buffer.isBuffer(record?.response?.body)).toBe(true);
      expect(JSON.parse(String(record?.response?.body))).toEqual({ charged: 5 });
    });

    test('a handler that fails after writing leaves neither row nor record; the retry runs again', async () => {
      const server = app(new Map());
      for (let attempt = 0; attempt < 2; attempt++) {
        await request(server)
          .post('/charges')
          .set('Idempotency-Key', 'fails')
          .send({ amount: 1, fail: true })
          .expect(500);
        expect(await library.count('fails')).toBe(0);
        expect(await library.recordState('fails')).toBeUndefined();
      }
      await request(server).post('/charges').set('Idempotency-Key', 'fails').send({ amount: 1 }).expect(201);
      expect(await library.count('fails')).toBe(1);
    });

    test('a commit that fails turns the handler’s 201 into a 500, and neither row nor record is kept', async () => {
      const res = await request(app(new Map()))
        .post('/charges')
        .set('Idempotency-Key', 'commit-fails')
        .send({ amount: 1, breakCommit: true });
      expect(res.status).toBe(500);
      expect(res.body.type).toBe('https://oncely.dev/problems/transaction-failed');
      expect(await library.count('commit-fails')).toBe(0);
      expect(await library.recordState('commit-fails')).toBeUndefined();
    });

    test('a duplicate gets 409 at once while the first transaction is open', async () => {
      let open!: () => void;
      const gates = new Map([['open-tx', new Promise<void>((resolve) => (open = resolve))]]);
      const server = app(gates);
      const first = request(server)
        .post('/charges')
        .set('Idempotency-Key', 'open-tx')
        .send({ amount: 2 })
        .then((r) => r);
      await sleep(300);
      const second = await request(server)
        .post('/charges')
        .set('Idempotency-Key', 'open-tx')
        .send({ amount: 2 });
      expect(second.status).toBe(409);
      expect(await library.count('open-tx')).toBe(0);
      open();
      expect((await first).status).toBe(201);
      expect(await library.count('open-tx')).toBe(1);
    });

    test('store.transaction(): 50 concurrent deliveries of one message run the work once', async () => {
      let runs = 0;
      const outcomes = await Promise.all(
        Array.from({ length: 50 }, () =>
          library
            .store()
            .transaction('msg', { ttl: '1h' }, async (tx) => {
              runs++;
              await library.insert(tx, 'msg');
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
      expect(outcomes.every((o) => ['executed', 'replayed', 'in-progress'].includes(o))).toBe(true);
      expect(await library.count('msg')).toBe(1);
      expect(await library.store().transaction('msg', {}, async () => ({ charged: -1 }))).toEqual({
        outcome: 'replayed',
        result: { charged: 9 },
      });
    });
  });
}
