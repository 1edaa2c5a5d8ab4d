/**
 * @services postgres redis
 */
import { randomUUID } from 'node:crypto';
import { RedisStore } from '@oncely/redis';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import postgres, { type TransactionSql } from 'postgres';
import { OutboxRelay, PostgresStore } from '../src';
import { postgresJs, testSchema } from './helpers';

jest.setTimeout(30_000);

const db = testSchema();
const sql = postgresJs();

storeContractSuite('PostgresStore on postgres.js', {
  create: async () => {
    const store = new PostgresStore({ sql, schema: db.schema });
    await store.migrate();
    return store;
  },
  destroy: () => {},
});

afterAll(async () => {
  await sql.end();
  await db.drop();
});

const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
const empty = { status: 200, headers: {}, body: new Uint8Array() };

describe('PostgresStore on postgres.js: specifics', () => {
  test('exactly one of pool and sql: both, or neither, is refused naming both', () => {
    expect(() => new PostgresStore({ sql, pool: db.pool() } as never)).toThrow(/"pool".*"sql"|"sql".*"pool"/);
    expect(() => new PostgresStore({} as never)).toThrow(/option "pool" or "sql" is required/);
  });

  test('records read back the same as through pg: bytea body, jsonb headers, bigint times', async () => {
    const store = new PostgresStore({ sql, schema: db.schema, table: 'types' });
    await store.migrate();
    const a = await store.acquire('k', lock);
    if (a.status !== 'acquired') throw new Error('expected acquired');
    await store.complete(
      'k',
      a.token,
      { status: 201, headers: { a: 'b' }, body: Buffer.from([0, 255]) },
      60_000,
    );
    const record = await store.get('k');
    expect(record?.response).toEqual({ status: 201, headers: { a: 'b' }, body: Buffer.from([0, 255]) });
    expect(typeof record?.expiresAt).toBe('number');
    // Read through pg: the headers are a JSON object, not a JSON string holding one.
    const { rows } = await db
      .pool()
      .query(`SELECT jsonb_typeof(headers) AS t, octet_length(body) AS n FROM "${db.schema}".types`);
    expect(rows[0]).toEqual({ t: 'object', n: 2 });
  });

  test('a postgres.js client that renames columns to camelCase and parses bigints changes nothing', async () => {
    const camel = postgresJs({ max: 2, transform: postgres.camel, types: { bigint: postgres.BigInt } });
    try {
      const store = new PostgresStore({ sql: camel, schema: db.schema, table: 'camel' });
      await store.migrate();
      const a = await store.acquire('k', lock);
      if (a.status !== 'acquired') throw new Error('expected acquired');
      const busy = await store.acquire('k', lock);
      expect(busy.status).toBe('in_progress');
      if (busy.status === 'in_progress') expect(busy.retryAfterMs).toBeGreaterThan(1000);
      expect(await store.recordStep('k', a.token, 'charge', 'ch_1', 60_000)).toBe(true);
      expect((await store.get('k'))?.steps).toEqual({ charge: 'ch_1' });
      expect(await store.complete('k', a.token, empty, 60_000)).toBe(true);
      expect((await store.acquire('k', lock)).status).toBe('completed');
    } finally {
      await camel.end();
    }
  });

  test('purgeExpired and the reaper delete expired records', async () => {
    const store = new PostgresStore({ sql, schema: db.schema, table: 'purge' });
    await store.migrate();
    for (let i = 0; i < 12; i++) {
      const a = await store.acquire(`old-${i}`, lock);
      if (a.status === 'acquired') await store.complete(`old-${i}`, a.token, empty, 1);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await store.purgeExpired({ batchSize: 5 })).toBe(12);
    const a = await store.acquire('reaped', lock);
    if (a.status === 'acquired') await store.complete('reaped', a.token, empty, 1);
    const reaper = store.startReaper({ interval: 30 });
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 30));
      left = (await sql.unsafe(`SELECT 1 FROM "${db.schema}".purge`)).count;
    }
    await reaper.stop();
    expect(left).toBe(0);
  });

  test('the outbox relay copies completions to the cache and empties the outbox', async () => {
    const client = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
    const prefix = `oncely-pgjs-relay:${randomUUID()}:`;
    try {
      const source = new PostgresStore({ sql, schema: db.schema, table: 'relayed', outbox: true });
      await source.migrate();
      const cache = new RedisStore({ client, prefix });
      for (const key of ['r1', 'r2', 'r3']) {
        const a = await source.acquire(key, { fingerprint: `fp-${key}`, lockTimeoutMs: 30_000 });
        if (a.status !== 'acquired') throw new Error('expected acquired');
        await source.complete(
          key,
          a.token,
          { status: 201, headers: { x: key }, body: Buffer.from(key) },
          60_000,
        );
      }
      const run = await new OutboxRelay({ store: source, cache, batchSize: 100 }).runOnce();
      expect(run).toEqual({ claimed: 3, copied: ['r1', 'r2', 'r3'] });
      expect((await sql.unsafe(`SELECT 1 FROM ${source.tables.outbox}`)).count).toBe(0);
      const cached = await cache.acquire('r2', { fingerprint: 'fp-r2', lockTimeoutMs: 30_000 });
      expect(cached).toMatchObject({ status: 'completed', response: { status: 201, headers: { x: 'r2' } } });
    } finally {
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      await client.quit();
    }
  });

  test('store.transaction() hands the work a postgres.js TransactionSql', async () => {
    const store = new PostgresStore({ sql, schema: db.schema, table: 'typed' });
    await store.migrate();
    const result = await store.transaction('t', {}, async (tx: TransactionSql) => {
      const [row] = await tx`SELECT txid_current_if_assigned() IS NOT NULL AS writing`;
      return row?.writing as boolean;
    });
    // The store's own INSERT came first in the same transaction: it already has a transaction id.
    expect(result).toEqual({ outcome: 'executed', result: true });
  });
});
