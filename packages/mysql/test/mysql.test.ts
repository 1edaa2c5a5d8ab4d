/**
 * @services mariadb
 */

import { IdempotencyOptionsError, type StoredResponse } from '@oncely/core';
import type { SqlTransactions } from '@oncely/core/adapter';
import mysql from 'mysql2/promise';
import { MySQLStore } from '../src';
import { mysqlUrl, testTables } from './helpers';

const db = testTables();
const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
const ok: StoredResponse = {
  status: 201,
  headers: { a: 'b', multi: ['1', '2'] },
  body: Buffer.from([0, 255, 1]),
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

afterAll(() => db.drop());

async function owned(store: MySQLStore, key: string, options = lock): Promise<string> {
  const acquired = await store.acquire(key, options);
  if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
  return acquired.token;
}

describe('MySQLStore on MariaDB', () => {
  let store: MySQLStore;
  let table: string;
  beforeAll(async () => {
    table = db.table('specifics');
    store = new MySQLStore({ pool: db.pool(), table });
    await store.migrate();
  });

  test('concurrent acquires of one key on 20 connections: exactly one winner, every round', async () => {
    for (let round = 0; round < 3; round++) {
      const key = `race-${round}`;
      const results = await Promise.all(Array.from({ length: 200 }, () => store.acquire(key, lock)));
      expect(results.filter((r) => r.status === 'acquired')).toHaveLength(1);
      expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(199);
    }
  });

  test('concurrent takeovers of a dead record: exactly one winner, and only its token completes', async () => {
    for (let round = 0; round < 5; round++) {
      const key = `takeover-${round}`;
      const stale = await owned(store, key, { fingerprint: 'f', lockTimeoutMs: 1 });
      await sleep(5);
      const results = await Promise.all(Array.from({ length: 100 }, () => store.acquire(key, lock)));
      const winners = results.filter((r) => r.status === 'acquired');
      expect(winners).toHaveLength(1);
      const winner = winners[0];
      if (winner?.status !== 'acquired') throw new Error('no winner');
      // Fencing after the takeover: the stale owner can do nothing, the new one everything.
      expect(await store.complete(key, stale, ok, 60_000)).toBe(false);
      expect(await store.renew(key, stale, 30_000)).toBe(false);
      expect(await store.release(key, stale)).toBe(false);
      expect(await store.recordStep(key, stale, 's', '1', 60_000)).toBe(false);
      expect((await store.get(key))?.token).toBe(winner.token);
      expect(await store.complete(key, winner.token, ok, 60_000)).toBe(true);
    }
  });

  test('a takeover of an expired completed record clears it: in progress, new fingerprint, no response', async () => {
    const first = await owned(store, 'expired-completed', { fingerprint: 'old', lockTimeoutMs: 30_000 });
    expect(await store.complete('expired-completed', first, ok, 1)).toBe(true);
    await sleep(5);
    const token = await owned(store, 'expired-completed', { fingerprint: 'new', lockTimeoutMs: 30_000 });
    const record = await store.get('expired-completed');
    expect(record).toMatchObject({ state: 'in_progress', fingerprint: 'new', token });
    expect(record?.response).toBeUndefined();
    expect((await store.acquire('expired-completed', lock)).status).toBe('in_progress');
    expect(await store.complete('expired-completed', token, { ...ok, status: 202 }, 60_000)).toBe(true);
    expect(await store.acquire('expired-completed', lock)).toMatchObject({ response: { status: 202 } });
  });

  test('round trips per step, as docs/stores/mysql.md lists them', async () => {
    // A pool whose execute() is counted: every store statement is one execute, one round trip once prepared.
    let trips = 0;
    const base = db.pool();
    const counted = new Proxy(base, {
      get(target, property, receiver) {
        if (property === 'execute')
          return (...args: Parameters<typeof base.execute>) => {
            trips++;
            return target.execute(...args);
          };
        return Reflect.get(target, property, receiver);
      },
    });
    const s = new MySQLStore({ pool: counted, table });
    const count = async (step: () => Promise<unknown>) => {
      trips = 0;
      await step();
      return trips;
    };
    let token = '';
    const fresh = await count(async () => {
      token = await owned(s, 'trips');
    });
    const duplicate = await count(() => s.acquire('trips', lock));
    const renew = await count(() => s.renew('trips', token, 30_000));
    const step = await count(() => s.recordStep('trips', token, 'a', '1', 60_000));
    const release = await count(() => s.release('trips', token));
    const resume = await count(async () => {
      token = await owned(s, 'trips');
    });
    const complete = await count(() => s.complete('trips', token, ok, 60_000));
    const replay = await count(() => s.acquire('trips', lock));
    const get = await count(() => s.get('trips'));
    const deleteLive = await count(() => s.delete('trips'));
    const deleteNone = await count(() => s.delete('trips'));
    await owned(s, 'trips-dead', { fingerprint: 'f', lockTimeoutMs: 1 });
    await sleep(5);
    const takeover = await count(() => owned(s, 'trips-dead'));
    expect({
      fresh,
      duplicate,
      renew,
      step,
      release,
      resume,
      complete,
      replay,
      get,
      deleteLive,
      deleteNone,
      takeover,
    }).toEqual({
      fresh: 1,
      takeover: 1,
      duplicate: 2,
      renew: 1,
      step: 1,
      release: 1,
      resume: 2,
      complete: 1,
      replay: 2,
      get: 1,
      deleteLive: 1,
      deleteNone: 2,
    });
  });

  test('renew within the same millisecond counts as matched, with or without CLIENT_FOUND_ROWS', async () => {
    // Without FOUND_ROWS, affected rows count only changed rows: a renew that lands on the same lease end changes
    // nothing, and must still answer true.
    const pool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 2, flags: ['-FOUND_ROWS'] });
    try {
      const plain = new MySQLStore({ pool, table });
      const token = await owned(plain, 'no-found-rows');
      const renewals = await Promise.all(
        Array.from({ length: 20 }, () => plain.renew('no-found-rows', token, 30_000)),
      );
      expect(renewals.every(Boolean)).toBe(true);
      expect((await plain.acquire('no-found-rows', lock)).status).toBe('in_progress');
      expect(await plain.complete('no-found-rows', token, ok, 60_000)).toBe(true);
      expect((await plain.acquire('no-found-rows', lock)).status).toBe('completed');
    } finally {
      await pool.end();
    }
  });

  test("MariaDB's SIMULTANEOUS_ASSIGNMENT mode: takeover and resume still assign every column", async () => {
    // Under this sql_mode an UPDATE's assignments all read the old row, not the columns assigned before them.
    const pool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 2 });
    pool.on('connection', (connection) => {
      connection.query("SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')");
    });
    try {
      const simultaneous = new MySQLStore({ pool, table });
      const stale = await owned(simultaneous, 'simultaneous', { fingerprint: 'first', lockTimeoutMs: 1 });
      await sleep(5);
      const taken = await simultaneous.acquire('simultaneous', {
        fingerprint: 'second',
        lockTimeoutMs: 30_000,
      });
      if (taken.status !== 'acquired') throw new Error(`expected acquired, got ${taken.status}`);
      expect(taken.token).not.toBe(stale);
      expect(await simultaneous.get('simultaneous')).toMatchObject({
        state: 'in_progress',
        fingerprint: 'second',
      });
      expect(await simultaneous.recordStep('simultaneous', taken.token, 'a', '1', 60_000)).toBe(true);
      expect(await simultaneous.release('simultaneous', taken.token)).toBe(true);
      const resumed = await simultaneous.acquire('simultaneous', {
        fingerprint: 'third',
        lockTimeoutMs: 30_000,
      });
      expect(resumed).toMatchObject({ status: 'acquired', steps: { a: '1' }, fingerprint: 'second' });
      const held = await simultaneous.acquire('simultaneous', lock);
      expect(held.status).toBe('in_progress');
    } finally {
      await pool.end();
    }
  });

  test('times come from the database clock and stay right whatever the session time zone', async () => {
    const pool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 1 });
    pool.on('connection', (connection) => {
      connection.query("SET time_zone = '+09:00'");
    });
    try {
      const shifted = new MySQLStore({ pool, table });
      const token = await owned(shifted, 'tz', { fingerprint: 'f', lockTimeoutMs: 60_000 });
      const record = await store.get('tz');
      const [rows] = await db.pool().query('SELECT UNIX_TIMESTAMP(UTC_TIMESTAMP(3)) * 1000 AS now_ms');
      const now = Number((rows as { now_ms: unknown }[])[0]?.now_ms);
      // The lease is a minute from the server's UTC now (not 9 hours off), seen alike from a UTC session.
      expect(Math.abs((record?.lockExpiresAt ?? 0) - (now + 60_000))).toBeLessThan(5_000);
      expect(await store.renew('tz', token, 60_000)).toBe(true);
    } finally {
      await pool.end();
    }
  });

  test('bodies are bytes, headers JSON text; a response round-trips byte for byte', async () => {
    const token = await owned(store, 'types');
    expect(await store.complete('types', token, ok, 60_000)).toBe(true);
    const [rows] = await db
      .pool()
      .query(
        `SELECT HEX(body) AS body, headers, expires_at - created_at AS ttl FROM \`${table}\` WHERE \`key\` = ?`,
        ['types'],
      );
    const row = (rows as { body: string; headers: string; ttl: number }[])[0];
    expect(row?.body).toBe('00FF01');
    expect(JSON.parse(row?.headers ?? '')).toEqual(ok.headers);
    expect(Number(row?.ttl)).toBeGreaterThanOrEqual(60_000);
    const replay = await store.acquire('types', lock);
    expect(replay).toMatchObject({ status: 'completed', fingerprint: 'f', response: { status: 201 } });
    if (replay.status === 'completed')
      expect(Buffer.from(replay.response.body)).toEqual(Buffer.from([0, 255, 1]));
  });

  test('a released record without steps expires at once: gone to get, taken by the next acquire, purged', async () => {
    const token = await owned(store, 'released');
    expect(await store.release('released', token)).toBe(true);
    expect(await store.get('released')).toBeUndefined();
    expect(await store.delete('released')).toBe(false);
    const again = await owned(store, 'released');
    expect(again).not.toBe(token);
    expect(await store.release('released', again)).toBe(true);
  });

  test('migrate is safe to run twice, and concurrently', async () => {
    const fresh = new MySQLStore({ pool: db.pool(), table: db.table('migrated') });
    await Promise.all([fresh.migrate(), fresh.migrate(), fresh.migrate(), fresh.migrate()]);
    await fresh.migrate();
    const [rows] = await db
      .pool()
      .query(
        'SELECT index_name AS name FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name',
        [db.table('migrated')],
      );
    expect((rows as { name: string }[]).map((r) => r.name)).toEqual([
      `${db.table('migrated')}_expires_at_idx`,
      'PRIMARY',
    ]);
    expect(MySQLStore.createTableSql('x')).toContain('CREATE TABLE IF NOT EXISTS `x`');
  });

  test('option mistakes are thrown at construction, naming the option', async () => {
    const pool = db.pool();
    expect(() => new MySQLStore({ pool, table: 'x; drop table y' })).toThrow(/option "table"/);
    expect(() => new MySQLStore({ pool, table: 'a'.repeat(49) })).toThrow(/option "table"/);
    expect(() => new MySQLStore({} as never)).toThrow(expect.objectContaining({ option: 'pool' }));
    expect(() => new MySQLStore({ pool: {} as never })).toThrow(IdempotencyOptionsError);
    const postgres: SqlTransactions<unknown> = {
      dialect: 'postgres',
      run: async () => {},
      query: async () => ({ rows: [], rowCount: 0 }),
    };
    expect(() => new MySQLStore({ pool, transactions: postgres })).toThrow(
      expect.objectContaining({ option: 'transactions' }),
    );
    expect(() => new MySQLStore({ pool, transactions: { ...postgres, dialect: 'mysql' } })).not.toThrow();
    await expect(store.purgeExpired({ batchSize: 0 })).rejects.toThrow(/option "batchSize"/);
  });
});

describe('purgeExpired and the reaper', () => {
  test('purgeExpired deletes expired records in batches of batchSize, and keeps live ones', async () => {
    const table = db.table('purge');
    const purge = new MySQLStore({ pool: db.pool(), table });
    await purge.migrate();
    for (let i = 0; i < 25; i++) {
      const token = await owned(purge, `old-${i}`);
      await purge.complete(`old-${i}`, token, ok, 1);
    }
    await purge.acquire('lease-gone', { fingerprint: 'f', lockTimeoutMs: 1 });
    const released = await owned(purge, 'released');
    await purge.release('released', released);
    const live = await owned(purge, 'live');
    await purge.complete('live', live, ok, 60_000);
    const held = await owned(purge, 'held');
    const stepped = await owned(purge, 'stepped', { fingerprint: 'f', lockTimeoutMs: 100 });
    expect(await purge.recordStep('stepped', stepped, 'a', '1', 60_000)).toBe(true);
    await sleep(150);
    // 27 expired rows; batches of 10 run 3 statements, and maxBatches stops a run early.
    expect(await purge.purgeExpired({ batchSize: 10, maxBatches: 2 })).toBe(20);
    expect(await purge.purgeExpired({ batchSize: 10 })).toBe(7);
    const [rows] = await db.pool().query(`SELECT CAST(\`key\` AS CHAR) AS k FROM \`${table}\` ORDER BY k`);
    expect((rows as { k: string }[]).map((r) => r.k)).toEqual(['held', 'live', 'stepped']);
    expect(await purge.purgeExpired()).toBe(0);
    expect((await purge.get('stepped'))?.state).toBe('released');
    expect(await purge.renew('held', held, 30_000)).toBe(true);
  });

  test('the purge finds expired rows through the expires_at index', async () => {
    const table = db.table('purge');
    const [rows] = await db
      .pool()
      .query(`EXPLAIN DELETE FROM \`${table}\` WHERE expires_at <= 5 ORDER BY expires_at LIMIT 10`);
    expect((rows as { key: string | null }[])[0]?.key).toBe(`${table}_expires_at_idx`);
  });

  test('the reaper purges on its interval until stopped', async () => {
    const table = db.table('reaped');
    const reaped = new MySQLStore({ pool: db.pool(), table });
    await reaped.migrate();
    const token = await owned(reaped, 'x');
    await reaped.complete('x', token, ok, 1);
    const reaper = reaped.startReaper({ interval: 30, batchSize: 5 });
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await sleep(30);
      const [rows] = await db.pool().query(`SELECT COUNT(*) AS n FROM \`${table}\``);
      left = Number((rows as { n: unknown }[])[0]?.n);
    }
    await reaper.stop();
    expect(left).toBe(0);
  });

  test('close() stops the reapers the store started', async () => {
    const table = db.table('closed');
    const closed = new MySQLStore({ pool: db.pool(), table });
    await closed.migrate();
    closed.startReaper({ interval: 20 });
    await closed.close();
    const token = await owned(closed, 'x');
    await closed.complete('x', token, ok, 1);
    await sleep(120);
    const [rows] = await db.pool().query(`SELECT COUNT(*) AS n FROM \`${table}\``);
    expect(Number((rows as { n: unknown }[])[0]?.n)).toBe(1);
  });
});
