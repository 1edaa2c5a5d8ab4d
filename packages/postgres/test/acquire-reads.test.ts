/**
 * @services postgres
 */
import type { AcquireResult, StoredResponse } from '@oncely/core';
import pg from 'pg';
import { PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

/**
 * A replay (a live completed record, or an in-progress record whose lease is live) is a plain read: it writes
 * nothing, takes no transaction id and waits on no row lock. A key with no live record still goes through the
 * atomic INSERT ... ON CONFLICT, and exactly one of many racing acquirers wins it.
 */

const db = testSchema();
const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const ok: StoredResponse = { status: 201, headers: { a: 'b' }, body: Buffer.from('done') };
let store: PostgresStore;

beforeAll(async () => {
  store = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'reads' });
  await store.migrate();
});
afterAll(() => db.drop());

async function completed(key: string, ttlMs = 60_000): Promise<string> {
  const acquired = await store.acquire(key, lock);
  if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
  expect(await store.complete(key, acquired.token, ok, ttlMs)).toBe(true);
  return acquired.token;
}

async function inProgress(key: string, lockTimeoutMs = 30_000): Promise<string> {
  const acquired = await store.acquire(key, { fingerprint: 'f', lockTimeoutMs });
  if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
  return acquired.token;
}

/** The row's system columns: xmin (the transaction that wrote this version), xmax (deleter or locker, else 0). */
async function rowVersion(key: string): Promise<{ xmin: string; xmax: string; ctid: string }> {
  const { rows } = await db
    .pool()
    .query(`SELECT xmin::text, xmax::text, ctid::text FROM "${db.schema}".reads WHERE key = $1`, [key]);
  if (rows[0] === undefined) throw new Error(`no row for ${key}`);
  return rows[0];
}

function expectReplay(result: AcquireResult): void {
  expect(result.status).toBe('completed');
  if (result.status === 'completed') {
    expect(result.fingerprint).toBe('f');
    expect(Buffer.from(result.response.body).toString()).toBe('done');
  }
}

describe('a replay is a read', () => {
  test('replays of a completed record leave its row untouched (no lock: xmax stays 0, same version)', async () => {
    await completed('replayed');
    const before = await rowVersion('replayed');
    expect(before.xmax).toBe('0');
    for (let i = 0; i < 5; i++) expectReplay(await store.acquire('replayed', lock));
    // A row lock (ON CONFLICT DO UPDATE whose WHERE is false) would have set xmax to the replayer's xid.
    expect(await rowVersion('replayed')).toEqual(before);
  });

  test('so does an acquire on a live lease', async () => {
    await inProgress('leased');
    const before = await rowVersion('leased');
    for (let i = 0; i < 5; i++) {
      const result = await store.acquire('leased', lock);
      expect(result.status).toBe('in_progress');
      if (result.status === 'in_progress') {
        expect(result.retryAfterMs).toBeGreaterThan(25_000);
        expect(result.retryAfterMs).toBeLessThanOrEqual(30_000);
      }
    }
    expect(await rowVersion('leased')).toEqual(before);
  });

  test('a replay takes no transaction id (so no WAL and no commit flush); a first execution does', async () => {
    await completed('no-xid');
    await inProgress('no-xid-leased');
    const client = await db.pool().connect();
    try {
      // A store whose every statement runs on this one client, inside a transaction we inspect.
      const onClient = new PostgresStore({
        pool: client as unknown as pg.Pool,
        schema: db.schema,
        table: 'reads',
      });
      const xidAfter = async (key: string) => {
        await client.query('BEGIN');
        try {
          const result = await onClient.acquire(key, lock);
          const { rows } = await client.query('SELECT pg_current_xact_id_if_assigned()::text AS xid');
          return { status: result.status, xid: rows[0].xid as string | null };
        } finally {
          await client.query('ROLLBACK');
        }
      };
      expect(await xidAfter('no-xid')).toEqual({ status: 'completed', xid: null });
      expect(await xidAfter('no-xid-leased')).toEqual({ status: 'in_progress', xid: null });
      const first = await xidAfter('no-xid-fresh'); // rolled back: the key stays free
      expect(first.status).toBe('acquired');
      expect(first.xid).not.toBeNull();
    } finally {
      client.release();
    }
  });

  test('replays do not wait on a row lock another transaction holds', async () => {
    await completed('held');
    await inProgress('held-leased');
    // A pool of its own whose statements give up on a lock after 2 s instead of waiting for it.
    const impatient = new pg.Pool({ connectionString, max: 10, options: '-c lock_timeout=2000' });
    const holder = await db.pool().connect();
    try {
      const replays = new PostgresStore({ pool: impatient, schema: db.schema, table: 'reads' });
      await holder.query('BEGIN');
      await holder.query(
        `SELECT 1 FROM "${db.schema}".reads WHERE key IN ('held', 'held-leased') FOR UPDATE`,
      );
      const results = await Promise.all([
        ...Array.from({ length: 8 }, () => replays.acquire('held', lock)),
        ...Array.from({ length: 2 }, () => replays.acquire('held-leased', lock)),
      ]);
      for (const result of results.slice(0, 8)) expectReplay(result);
      for (const result of results.slice(8)) expect(result.status).toBe('in_progress');
    } finally {
      await holder.query('ROLLBACK').catch(() => {});
      holder.release();
      await impatient.end();
    }
  });
});

describe('a key with no live record is still taken atomically', () => {
  test('an expired completed record is taken over with a new token', async () => {
    const old = await completed('expired', 1);
    await sleep(20);
    const result = await store.acquire('expired', { fingerprint: 'g', lockTimeoutMs: 30_000 });
    expect(result.status).toBe('acquired');
    if (result.status !== 'acquired') return;
    expect(result.token).not.toBe(old);
    expect(await store.complete('expired', old, ok, 60_000)).toBe(false);
    const record = await store.get('expired');
    expect(record).toMatchObject({ state: 'in_progress', fingerprint: 'g', token: result.token });
    expect(record?.response).toBeUndefined();
    expect(await store.complete('expired', result.token, ok, 60_000)).toBe(true);
  });

  test('an in-progress record whose lease ran out is taken over with a new token', async () => {
    const old = await inProgress('lapsed', 1);
    await sleep(20);
    const result = await store.acquire('lapsed', lock);
    expect(result.status).toBe('acquired');
    if (result.status !== 'acquired') return;
    expect(result.token).not.toBe(old);
    expect(await store.complete('lapsed', old, ok, 60_000)).toBe(false);
    expect(await store.renew('lapsed', result.token, 30_000)).toBe(true);
  });

  test.each([
    ['an expired completed record', (key: string) => completed(key, 1)],
    ['a lapsed lease', (key: string) => inProgress(key, 1)],
    ['no record', async () => ''],
  ])('racing acquirers on %s: exactly one wins, the others see it in progress', async (label, seed) => {
    for (let round = 0; round < 3; round++) {
      const key = `race-${label.replace(/ /g, '-')}-${round}`;
      await seed(key);
      await sleep(20);
      const results = await Promise.all(Array.from({ length: 30 }, () => store.acquire(key, lock)));
      expect(results.filter((r) => r.status === 'acquired')).toHaveLength(1);
      expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(29);
    }
  });

  test('acquirers looping across the moment a record expires: replays until then, then exactly one owner', async () => {
    await completed('boundary', 150);
    const seen: AcquireResult['status'][] = [];
    const until = Date.now() + 400;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (Date.now() < until) {
          seen.push((await store.acquire('boundary', lock)).status);
          await sleep(5);
        }
      }),
    );
    expect(seen.filter((s) => s === 'acquired')).toHaveLength(1);
    expect(seen).toContain('completed');
    expect(seen).toContain('in_progress');
  });

  test('transactional mode: a replay and a lapsed record behave as in plain mode', async () => {
    await completed('tx-replay');
    const replay = await store.acquireInTransaction('tx-replay', lock);
    expect(replay.status).toBe('completed');
    await completed('tx-expired', 1);
    await sleep(20);
    const taken = await store.acquireInTransaction('tx-expired', lock);
    expect(taken.status).toBe('acquired');
    if (taken.status === 'acquired') expect(await taken.transaction.commit(ok, 60_000)).toBe(true);
    expectReplay(await store.acquire('tx-expired', lock));
  });
});
