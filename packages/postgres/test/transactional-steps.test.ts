/**
 * @services postgres
 */
import { currentIdempotency, IdempotencyMismatchError } from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import request from 'supertest';
import { PostgresStore, transactionClient } from '../src';
import { testSchema } from './helpers';

jest.setTimeout(30_000);

// A record released with steps by a non-transactional engine, then reused in transactional mode with another
// request: the transaction must refuse it (422 / mismatch) and roll back, leaving the record and the pool as they were.
const db = testSchema();
let plain: PostgresStore;
let transactional: PostgresStore;

beforeAll(async () => {
  plain = new PostgresStore({ pool: db.pool(), schema: db.schema });
  transactional = new PostgresStore({ pool: db.pool(), schema: db.schema });
  await plain.migrate();
  await db.pool().query(`CREATE TABLE "${db.schema}".charges (key text NOT NULL, amount int)`);
});
afterAll(() => db.drop());

const charges = async (key: string) =>
  Number(
    (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
      .count,
  );

/** No client checked out nor waited for once the request is answered: a leaked one holds its lock. */
function expectPoolIdle(): void {
  const pool = db.pool();
  expect(pool.waitingCount).toBe(0);
  expect(pool.idleCount).toBe(pool.totalCount);
}

describe('a record carrying steps, reused with another fingerprint in a transaction', () => {
  test('HTTP (Express, transactional): 422, the record and its steps unchanged, no client leaked', async () => {
    const key = 'http-mismatch';
    const first = express();
    first.use(express.json());
    first.use(idempotency({ store: plain }));
    first.post('/charges', async (_req, res) => {
      await currentIdempotency()?.step('charge', async () => 'ch_1');
      res.status(500).json({ failed: true });
    });
    // A 5xx releases the key; the record keeps its step and the first request's fingerprint.
    await request(first).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(500);
    const before = await plain.get(key);
    expect(before?.state).toBe('released');
    expect(before?.steps).toEqual({ charge: '"ch_1"' });

    const second = express();
    second.use(express.json());
    second.use(idempotency({ store: transactional, transactional: true }));
    let runs = 0;
    second.post('/charges', async (req, res) => {
      runs++;
      await transactionClient(req).query(`INSERT INTO "${db.schema}".charges VALUES ($1, $2)`, [
        req.idempotencyKey,
        req.body.amount,
      ]);
      res.status(201).json({ charged: req.body.amount });
    });
    const other = await request(second).post('/charges').set('Idempotency-Key', key).send({ amount: 2 });
    expect(other.status).toBe(422);
    expect(runs).toBe(0);
    expect(await charges(key)).toBe(0);
    const after = await plain.get(key);
    expect(after?.state).toBe('released');
    expect(after?.fingerprint).toBe(before?.fingerprint);
    expect(after?.steps).toEqual({ charge: '"ch_1"' });
    expectPoolIdle();

    // The first request's retry still resumes its own record (no lock or row left held by the refused one).
    await request(second).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(201);
    expect(runs).toBe(1);
    expect((await plain.get(key))?.fingerprint).toBe(before?.fingerprint);
    expectPoolIdle();
  });

  test('consumer transaction (runStoreTransaction): IdempotencyMismatchError, record unchanged, no client leaked', async () => {
    const key = 'consumer-mismatch';
    const acquired = await plain.acquire(key, { fingerprint: 'F1', lockTimeoutMs: 5_000 });
    if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
    expect(await plain.recordStep(key, acquired.token, 'charge', '"ch_1"', 60_000)).toBe(true);
    expect(await plain.release(key, acquired.token)).toBe(true);

    let runs = 0;
    await expect(
      transactional.transaction(key, { fingerprint: 'F2' }, async () => {
        runs++;
        return 'F2 result';
      }),
    ).rejects.toBeInstanceOf(IdempotencyMismatchError);
    expect(runs).toBe(0);
    const after = await plain.get(key);
    expect(after?.state).toBe('released');
    expect(after?.fingerprint).toBe('F1');
    expect(after?.steps).toEqual({ charge: '"ch_1"' });
    expectPoolIdle();

    // The right fingerprint still runs (the refused transaction holds nothing) and its result is the one kept.
    await expect(
      transactional.transaction(key, { fingerprint: 'F1' }, async () => 'F1 result'),
    ).resolves.toEqual({
      outcome: 'executed',
      result: 'F1 result',
    });
    const replay = await transactional.transaction(key, { fingerprint: 'F1' }, async () => 'again');
    expect(replay).toEqual({ outcome: 'replayed', result: 'F1 result' });
    expectPoolIdle();
  });
});
