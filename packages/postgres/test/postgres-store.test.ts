/**
 * @services postgres
 */

import { IdempotencyOptionsError } from '@oncely/core';
import { storeContractSuite } from '@oncely/testing';
import { PostgresStore } from '../src';
import { testSchema } from './helpers';

const db = testSchema();

storeContractSuite('PostgresStore', {
  create: async () => {
    const store = new PostgresStore({ pool: db.pool(), schema: db.schema });
    await store.migrate();
    return store;
  },
  destroy: () => {}, // the schema and pool outlive the suite: dropped once, below
});

afterAll(() => db.drop());

describe('PostgresStore specifics', () => {
  const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
  let store: PostgresStore;
  beforeAll(async () => {
    store = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'specifics' });
    await store.migrate();
  });

  test('migrate is safe to run twice, and concurrently', async () => {
    await store.migrate();
    await Promise.all([store.migrate(), store.migrate(), store.migrate()]);
    const { rows } = await db
      .pool()
      .query(
        `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'specifics' ORDER BY indexname`,
        [db.schema],
      );
    expect(rows.map((r) => r.indexname)).toEqual(['specifics_expires_at_idx', 'specifics_pkey']);
  });

  test('migrate creates the outbox table only for a store with outbox: true', async () => {
    const exists = async (table: string) =>
      (await db.pool().query('SELECT to_regclass($1) IS NOT NULL AS present', [`"${db.schema}"."${table}"`]))
        .rows[0].present as boolean;
    await new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'plain' }).migrate();
    expect(await exists('plain')).toBe(true);
    expect(await exists('plain_outbox')).toBe(false);
    // Turning the outbox on later: migrate() adds its table beside the records.
    await new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'plain', outbox: true }).migrate();
    expect(await exists('plain_outbox')).toBe(true);
  });

  test('bodies are stored as bytea, headers as jsonb, times from the database clock', async () => {
    const acquired = await store.acquire('types', lock);
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    await store.complete(
      'types',
      acquired.token,
      { status: 201, headers: { a: 'b' }, body: Buffer.from([0, 255, 1]) },
      60_000,
    );
    const { rows } = await db.pool().query(
      `SELECT pg_typeof(body)::text AS body_type, pg_typeof(headers)::text AS headers_type, octet_length(body) AS n,
              expires_at - created_at > interval '59 seconds' AS ttl_from_db
       FROM "${db.schema}".specifics WHERE key = 'types'`,
    );
    expect(rows[0]).toEqual({ body_type: 'bytea', headers_type: 'jsonb', n: 3, ttl_from_db: true });
  });

  test('option names are checked', () => {
    expect(() => new PostgresStore({ pool: db.pool(), table: 'x; drop table y' })).toThrow(/option "table"/);
    expect(() => new PostgresStore({ pool: db.pool(), schema: '' })).toThrow(/option "schema"/);
    expect(() => new PostgresStore({} as never)).toThrow(/option "pool"/);
    expect(() => new PostgresStore({ pool: db.pool(), schema: '' })).toThrow(IdempotencyOptionsError);
    expect(() => new PostgresStore({} as never)).toThrow(expect.objectContaining({ option: 'pool' }));
  });

  test('purgeExpired deletes expired records in batches and keeps live ones', async () => {
    const purge = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'purge' });
    await purge.migrate();
    for (let i = 0; i < 25; i++) {
      const a = await purge.acquire(`old-${i}`, lock);
      if (a.status === 'acquired')
        await purge.complete(`old-${i}`, a.token, { status: 200, headers: {}, body: new Uint8Array() }, 1);
    }
    await purge.acquire('lease-gone', { fingerprint: 'f', lockTimeoutMs: 1 });
    const live = await purge.acquire('live', lock);
    if (live.status === 'acquired')
      await purge.complete('live', live.token, { status: 200, headers: {}, body: new Uint8Array() }, 60_000);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await purge.purgeExpired({ batchSize: 10 })).toBe(26);
    const { rows } = await db.pool().query(`SELECT key FROM "${db.schema}".purge`);
    expect(rows.map((r) => r.key)).toEqual(['live']);
    expect(await purge.purgeExpired()).toBe(0);
  });

  test('the reaper purges on its interval until stopped', async () => {
    const reaped = new PostgresStore({ pool: db.pool(), schema: db.schema, table: 'reaped' });
    await reaped.migrate();
    const a = await reaped.acquire('x', lock);
    if (a.status === 'acquired')
      await reaped.complete('x', a.token, { status: 200, headers: {}, body: new Uint8Array() }, 1);
    const reaper = reaped.startReaper({ interval: 30, batchSize: 5 });
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 30));
      left = Number((await db.pool().query(`SELECT count(*) FROM "${db.schema}".reaped`)).rows[0].count);
    }
    await reaper.stop();
    expect(left).toBe(0);
  });
});
