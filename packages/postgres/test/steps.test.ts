/**
 * @services postgres
 */
import type { AcquireResult, StoredResponse } from '@oncely/core';
import pg from 'pg';
import { CachedStore, PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

/**
 * Steps in PostgresStore: a record that carries steps outlives release and lease lapse as `released`, is resumed
 * by the next acquire with its fingerprint and steps, expires ttl after its latest step (or at its lease's end),
 * loses its steps on complete, and is purged by the reaper once expired.
 */

const db = testSchema();
const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
const ok: StoredResponse = { status: 201, headers: { a: 'b' }, body: Buffer.from('done') };
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
let store: PostgresStore;
const table = 'steps';

beforeAll(async () => {
  store = new PostgresStore({ pool: db.pool(), schema: db.schema, table });
  await store.migrate();
});
afterAll(() => db.drop());

async function owned(key: string, options = lock): Promise<string> {
  const acquired = await store.acquire(key, options);
  if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
  return acquired.token;
}

function expectAcquired(result: AcquireResult): Extract<AcquireResult, { status: 'acquired' }> {
  if (result.status !== 'acquired') throw new Error(`expected acquired, got ${result.status}`);
  return result;
}

async function row(key: string, name = table) {
  const { rows } = await db
    .pool()
    .query(
      `SELECT state, steps, keep_until, expires_at, lock_expires_at FROM "${db.schema}"."${name}" WHERE key = $1`,
      [key],
    );
  return rows[0] as { state: string; steps: Record<string, string> | null } | undefined;
}

describe('recordStep', () => {
  test('records under the owner of a live lease, replacing a value under the same name', async () => {
    const token = await owned('record');
    expect(await store.recordStep('record', token, 'charge', '{"id":"ch_1"}', 60_000)).toBe(true);
    expect(await store.recordStep('record', token, 'email', '', 60_000)).toBe(true);
    expect(await store.recordStep('record', token, 'charge', '{"id":"ch_2"}', 60_000)).toBe(true);
    const record = await store.get('record');
    expect(record).toMatchObject({ state: 'in_progress', token, fingerprint: 'f' });
    expect(record?.steps).toEqual({ charge: '{"id":"ch_2"}', email: '' });
  });

  test('gives back each value as it was given (escapes, non-ASCII, a name with braces and spaces, 1 MiB)', async () => {
    const token = await owned('values');
    const values: Record<string, string> = {
      'a {b} c': '"\\u0000 \\" \\\\ \\n"',
      'é 💳': '"日本語 💳 \u2028"',
      big: JSON.stringify('x'.repeat(1_048_574)),
    };
    for (const [name, value] of Object.entries(values))
      expect(await store.recordStep('values', token, name, value, 60_000)).toBe(true);
    expect((await store.get('values'))?.steps).toEqual(values);
  });

  test('is one statement, one round trip', async () => {
    const token = await owned('one-trip');
    const pool = db.pool();
    const spy = jest.spyOn(pool, 'query');
    try {
      expect(await store.recordStep('one-trip', token, 'a', '1', 60_000)).toBe(true);
      expect(await store.release('one-trip', token)).toBe(true);
      expect(spy).toHaveBeenCalledTimes(2);
    } finally {
      spy.mockRestore();
    }
  });

  test('is fenced: another token, a lapsed lease, a completed or released record write nothing', async () => {
    const token = await owned('fenced');
    expect(await store.recordStep('fenced', 'not-the-token', 'a', '1', 60_000)).toBe(false);
    expect((await row('fenced'))?.steps).toBeNull();

    const lapsing = await owned('fenced-lapsed', { fingerprint: 'f', lockTimeoutMs: 30 });
    await sleep(60);
    expect(await store.recordStep('fenced-lapsed', lapsing, 'a', '1', 60_000)).toBe(false);
    expect(await store.get('fenced-lapsed')).toBeUndefined();

    expect(await store.complete('fenced', token, ok, 60_000)).toBe(true);
    expect(await store.recordStep('fenced', token, 'a', '1', 60_000)).toBe(false);
    expect((await row('fenced'))?.steps).toBeNull();

    const released = await owned('fenced-released');
    expect(await store.recordStep('fenced-released', released, 'a', '1', 60_000)).toBe(true);
    expect(await store.release('fenced-released', released)).toBe(true);
    expect(await store.recordStep('fenced-released', released, 'b', '2', 60_000)).toBe(false);
    expect(await store.renew('fenced-released', released, 30_000)).toBe(false);
    expect(await store.complete('fenced-released', released, ok, 60_000)).toBe(false);
    expect(await store.release('fenced-released', released)).toBe(false);
    expect((await store.get('fenced-released'))?.steps).toEqual({ a: '1' });
  });
});

describe('a record with steps', () => {
  test('is kept as released by release, and resumed by the next acquire with its fingerprint and steps', async () => {
    const first = await owned('resume', { fingerprint: 'first', lockTimeoutMs: 30_000 });
    expect(await store.recordStep('resume', first, 'charge', '"ch_1"', 60_000)).toBe(true);
    expect(await store.release('resume', first)).toBe(true);
    expect(await store.get('resume')).toMatchObject({ state: 'released', steps: { charge: '"ch_1"' } });

    const resumed = expectAcquired(
      await store.acquire('resume', { fingerprint: 'second', lockTimeoutMs: 30_000 }),
    );
    expect(resumed.token).not.toBe(first);
    expect(resumed.steps).toEqual({ charge: '"ch_1"' });
    expect(resumed.fingerprint).toBe('first');
    expect(await store.get('resume')).toMatchObject({
      state: 'in_progress',
      token: resumed.token,
      fingerprint: 'first',
      steps: { charge: '"ch_1"' },
    });
    // The old owner is fenced off; the new one records on top of the kept steps and completes, dropping them.
    expect(await store.recordStep('resume', first, 'email', '', 60_000)).toBe(false);
    expect(await store.recordStep('resume', resumed.token, 'email', '', 60_000)).toBe(true);
    expect(await store.complete('resume', resumed.token, ok, 60_000)).toBe(true);
    const completed = await store.get('resume');
    expect(completed).toMatchObject({ state: 'completed', fingerprint: 'first' });
    expect(completed?.steps).toBeUndefined();
    expect((await row('resume'))?.steps).toBeNull();
    expect((await store.acquire('resume', lock)).status).toBe('completed');
  });

  test('whose lease ran out is released, and resumed', async () => {
    const first = await owned('lapsed', { fingerprint: 'f', lockTimeoutMs: 500 });
    expect(await store.recordStep('lapsed', first, 'a', '1', 60_000)).toBe(true);
    expect((await store.acquire('lapsed', lock)).status).toBe('in_progress');
    await sleep(600);
    expect(await store.get('lapsed')).toMatchObject({ state: 'released', steps: { a: '1' } });
    expect(await store.renew('lapsed', first, 30_000)).toBe(false);
    const resumed = expectAcquired(
      await store.acquire('lapsed', { fingerprint: 'g', lockTimeoutMs: 30_000 }),
    );
    expect(resumed).toMatchObject({ steps: { a: '1' }, fingerprint: 'f' });
    expect(await store.release('lapsed', first)).toBe(false);
    expect(await store.get('lapsed')).toMatchObject({ state: 'in_progress', token: resumed.token });
  });

  test('racing acquirers on a released record: exactly one resumes it', async () => {
    for (let round = 0; round < 3; round++) {
      const key = `race-${round}`;
      const token = await owned(key);
      expect(await store.recordStep(key, token, 'a', '1', 60_000)).toBe(true);
      expect(await store.release(key, token)).toBe(true);
      const results = await Promise.all(Array.from({ length: 30 }, () => store.acquire(key, lock)));
      const acquired = results.filter((r) => r.status === 'acquired');
      expect(acquired).toHaveLength(1);
      expect(acquired[0]).toMatchObject({ steps: { a: '1' }, fingerprint: 'f' });
      expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(29);
    }
  });

  test('expires ttl after its latest step once released; then acquire starts afresh', async () => {
    const token = await owned('expiring', { fingerprint: 'old', lockTimeoutMs: 30_000 });
    expect(await store.recordStep('expiring', token, 'a', '1', 150)).toBe(true);
    await sleep(100);
    // A later step moves the keep time: 1 s from now, not 150 ms from the first.
    expect(await store.recordStep('expiring', token, 'b', '2', 1_000)).toBe(true);
    expect(await store.release('expiring', token)).toBe(true);
    await sleep(150);
    expect(await store.get('expiring')).toMatchObject({ state: 'released' });
    await sleep(1_000);
    expect(await store.get('expiring')).toBeUndefined();
    expect(await store.delete('expiring')).toBe(false);
    const fresh = expectAcquired(
      await store.acquire('expiring', { fingerprint: 'new', lockTimeoutMs: 30_000 }),
    );
    expect(fresh.steps).toBeUndefined();
    expect(fresh.fingerprint).toBeUndefined();
    expect(await store.get('expiring')).toMatchObject({ state: 'in_progress', fingerprint: 'new' });
    expect((await store.get('expiring'))?.steps).toBeUndefined();
  });

  test('is kept until its lease ends when that is later than ttl after its latest step', async () => {
    const token = await owned('lease-later', { fingerprint: 'f', lockTimeoutMs: 1_000 });
    expect(await store.recordStep('lease-later', token, 'a', '1', 1)).toBe(true);
    await sleep(50);
    expect(await store.get('lease-later')).toMatchObject({ state: 'in_progress', steps: { a: '1' } });
    expect(await store.renew('lease-later', token, 1_000)).toBe(true);
    expect((await store.acquire('lease-later', lock)).status).toBe('in_progress');
    await sleep(1_100);
    expect(await store.get('lease-later')).toBeUndefined();
    expect(expectAcquired(await store.acquire('lease-later', lock)).steps).toBeUndefined();
  });

  test('renewed to a shorter lease, it is still kept ttl after its latest step', async () => {
    const token = await owned('renewed');
    expect(await store.recordStep('renewed', token, 'a', '1', 60_000)).toBe(true);
    expect(await store.renew('renewed', token, 30)).toBe(true);
    await sleep(60);
    expect(await store.get('renewed')).toMatchObject({ state: 'released', steps: { a: '1' } });
    expect(expectAcquired(await store.acquire('renewed', lock)).steps).toEqual({ a: '1' });
  });

  test('delete removes it, true while it is released', async () => {
    const token = await owned('deleted');
    expect(await store.recordStep('deleted', token, 'a', '1', 60_000)).toBe(true);
    expect(await store.release('deleted', token)).toBe(true);
    expect(await store.delete('deleted')).toBe(true);
    expect(await store.get('deleted')).toBeUndefined();
    expect(expectAcquired(await store.acquire('deleted', lock)).steps).toBeUndefined();
  });

  test('a record without steps is still deleted by release', async () => {
    const token = await owned('plain');
    expect(await store.release('plain', token)).toBe(true);
    expect(await row('plain')).toBeUndefined();
  });

  test('transactional mode: a resumed record commits completed without its steps, or rolls back as it was', async () => {
    const token = await owned('tx');
    expect(await store.recordStep('tx', token, 'a', '1', 60_000)).toBe(true);
    expect(await store.release('tx', token)).toBe(true);
    const rolled = await store.acquireInTransaction('tx', lock);
    if (rolled.status !== 'acquired') throw new Error(`expected acquired, got ${rolled.status}`);
    await rolled.transaction.rollback();
    expect(await store.get('tx')).toMatchObject({ state: 'released', steps: { a: '1' } });
    const committed = await store.acquireInTransaction('tx', lock);
    if (committed.status !== 'acquired') throw new Error(`expected acquired, got ${committed.status}`);
    expect(await committed.transaction.commit(ok, 60_000)).toBe(true);
    expect(await row('tx')).toMatchObject({ state: 'completed', steps: null });
  });

  test('CachedStore records steps in PostgreSQL', async () => {
    const cached = new CachedStore({
      source: store,
      cache: { get: async () => undefined, putCompleted: async () => true },
    });
    const acquired = expectAcquired(await cached.acquire('cached', lock));
    expect(await cached.recordStep('cached', acquired.token, 'a', '1', 60_000)).toBe(true);
    expect(await cached.release('cached', acquired.token)).toBe(true);
    expect(expectAcquired(await cached.acquire('cached', lock)).steps).toEqual({ a: '1' });
  });
});

describe('the reaper', () => {
  test('deletes expired released records in its batches and keeps live ones', async () => {
    const reaped = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'reaped_steps' });
    await reaped.migrate();
    const stepped = async (key: string, ttlMs: number, lockTimeoutMs: number, release: boolean) => {
      const acquired = expectAcquired(await reaped.acquire(key, { fingerprint: 'f', lockTimeoutMs }));
      expect(await reaped.recordStep(key, acquired.token, 'a', '1', ttlMs)).toBe(true);
      if (release) expect(await reaped.release(key, acquired.token)).toBe(true);
    };
    for (let i = 0; i < 12; i++) await stepped(`released-${i}`, 1, 30_000, true);
    for (let i = 0; i < 3; i++) await stepped(`lapsed-${i}`, 1, 500, false);
    await stepped('live-released', 60_000, 30_000, true);
    await stepped('live-lapsed', 60_000, 500, false);
    await stepped('live-held', 1, 30_000, false);
    await sleep(600);
    // Bounded: one batch of 5 per run.
    expect(await reaped.purgeExpired({ batchSize: 5, maxBatches: 1 })).toBe(5);
    expect(await reaped.purgeExpired({ batchSize: 5 })).toBe(10);
    const { rows } = await db.pool().query(`SELECT key FROM "${db.schema}".reaped_steps ORDER BY key`);
    expect(rows.map((r) => r.key)).toEqual(['live-held', 'live-lapsed', 'live-released']);
    expect(await reaped.get('live-lapsed')).toMatchObject({ state: 'released' });
  });
});

describe('migrate', () => {
  /** The table as the migration before steps made it. */
  const oldSchema = (t: string) => [
    `CREATE TABLE ${t} (
      key text PRIMARY KEY,
      fingerprint text NOT NULL,
      state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
      token text NOT NULL,
      lock_expires_at timestamptz,
      status integer,
      headers jsonb,
      body bytea,
      created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
      expires_at timestamptz NOT NULL
    )`,
    `CREATE INDEX "legacy_expires_at_idx" ON ${t} (expires_at)`,
  ];

  test('upgrades a table made before steps in place, keeping its records', async () => {
    const t = `"${db.schema}"."legacy"`;
    for (const statement of oldSchema(t)) await db.pool().query(statement);
    await db.pool().query(
      `INSERT INTO ${t} (key, fingerprint, state, token, lock_expires_at, status, headers, body, expires_at) VALUES
        ('done', 'f', 'completed', 't1', NULL, 201, '{"a":"b"}', 'done', clock_timestamp() + interval '1 minute'),
        ('held', 'f', 'in_progress', 't2', clock_timestamp() + interval '1 minute', NULL, NULL, NULL,
          clock_timestamp() + interval '1 minute')`,
    );
    const legacy = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'legacy' });
    await legacy.migrate();
    const { rows } = await db.pool().query(
      `SELECT column_name, data_type FROM information_schema.columns
       WHERE table_schema = $1 AND table_name = 'legacy' AND column_name IN ('steps', 'keep_until')
       ORDER BY column_name`,
      [db.schema],
    );
    expect(rows).toEqual([
      { column_name: 'keep_until', data_type: 'timestamp with time zone' },
      { column_name: 'steps', data_type: 'jsonb' },
    ]);
    const replay = await legacy.acquire('done', lock);
    expect(replay.status).toBe('completed');
    if (replay.status === 'completed') expect(Buffer.from(replay.response.body).toString()).toBe('done');
    expect((await legacy.acquire('held', lock)).status).toBe('in_progress');
    expect(await legacy.recordStep('held', 't2', 'a', '1', 60_000)).toBe(true);
    expect(await legacy.release('held', 't2')).toBe(true);
    expect(expectAcquired(await legacy.acquire('held', lock)).steps).toEqual({ a: '1' });
    await legacy.migrate(); // again: nothing left to do
  });

  test('an upgraded table is not altered again, so migrate does not wait on a transaction using it', async () => {
    // ALTER TABLE takes an exclusive lock even when IF NOT EXISTS finds the columns: it would queue behind this.
    const impatient = new pg.Pool({ connectionString, max: 2, options: '-c lock_timeout=1000' });
    const holder = await db.pool().connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM "${db.schema}"."${table}" FOR UPDATE`);
      await new PostgresStore({ pool: impatient, schema: db.schema, table }).migrate();
      // The same ALTER, run as the old migrate would have: it waits for the holder, and gives up.
      await expect(
        impatient.query(`ALTER TABLE "${db.schema}"."${table}" ADD COLUMN IF NOT EXISTS steps jsonb`),
      ).rejects.toThrow(/lock timeout/);
    } finally {
      await holder.query('ROLLBACK').catch(() => {});
      holder.release();
      await impatient.end();
    }
  });
});
