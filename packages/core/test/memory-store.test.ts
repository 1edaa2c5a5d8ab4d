import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { MemoryStore } from '@oncely/core';
import { storeContractSuite } from '@oncely/testing';

storeContractSuite('MemoryStore', { create: () => new MemoryStore() });

describe('MemoryStore specifics', () => {
  const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
  const response = { status: 200, headers: {}, body: new Uint8Array([1]) };

  test('maxEntries bounds completed records, evicting the least recently used', async () => {
    const store = new MemoryStore({ maxEntries: 3 });
    for (const k of ['a', 'b', 'c']) {
      const r = await store.acquire(k, lock);
      if (r.status === 'acquired') await store.complete(k, r.token, response, 60_000);
    }
    // Touch 'a' so 'b' becomes the least recently used.
    expect((await store.acquire('a', lock)).status).toBe('completed');
    const d = await store.acquire('d', lock);
    if (d.status === 'acquired') await store.complete('d', d.token, response, 60_000);
    expect(store.size).toBe(3);
    expect((await store.acquire('a', lock)).status).toBe('completed');
    expect((await store.acquire('c', lock)).status).toBe('completed');
    expect((await store.acquire('d', lock)).status).toBe('completed');
    expect((await store.acquire('b', lock)).status).toBe('acquired'); // evicted, so new again
    await store.close();
  });

  test('after thousands of evictions and touches, exactly the most recently used records remain', async () => {
    const store = new MemoryStore({ maxEntries: 100 });
    for (let i = 0; i < 3000; i++) {
      const r = await store.acquire(`n${i}`, lock);
      if (r.status === 'acquired') await store.complete(`n${i}`, r.token, response, 60_000);
      // Keep touching n0: a used record is never the one evicted.
      expect((await store.acquire('n0', lock)).status).toBe('completed');
    }
    expect(store.size).toBe(100);
    expect((await store.get('n0'))?.state).toBe('completed');
    for (let i = 2902; i < 3000; i++) expect((await store.get(`n${i}`))?.state).toBe('completed');
    expect(await store.get('n2900')).toBeUndefined();
    expect(await store.delete('n2999')).toBe(true);
    expect(store.size).toBe(99);
    await store.close();
  });

  test('in-progress records are never evicted to make room', async () => {
    const store = new MemoryStore({ maxEntries: 1 });
    for (const k of ['x', 'y', 'z']) expect((await store.acquire(k, lock)).status).toBe('acquired');
    for (const k of ['x', 'y', 'z']) expect((await store.acquire(k, lock)).status).toBe('in_progress');
    await store.close();
  });

  test('the sweep frees expired records without being asked', async () => {
    // Fake clock and timers: the store's monotonic clock (performance.now) and its sweep interval move only when
    // told, so a loaded machine cannot let the ttl run out before the count. Its answers still wait for real
    // loop turns (setImmediate).
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore({ sweepInterval: 20 });
      for (let i = 0; i < 50; i++) {
        const r = await store.acquire(`k${i}`, lock);
        if (r.status === 'acquired') await store.complete(`k${i}`, r.token, response, 150);
      }
      await store.acquire('lease', { fingerprint: 'f', lockTimeoutMs: 150 });
      await jest.advanceTimersByTimeAsync(140);
      expect(store.size).toBe(51);
      // Past the ttl and the lease, a few sweeps later: freed, with no call on the store.
      await jest.advanceTimersByTimeAsync(60);
      expect(store.size).toBe(0);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('the sweep frees only what expired: mixed ttls, renewed leases, keys reused after eviction', async () => {
    // Fake clock and timers, as above: leases, ttls and sweeps move only when told, so a loaded machine cannot lapse
    // a renewed lease between two renewals.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore({ sweepInterval: 10, maxEntries: 4 });
      const completeWith = async (key: string, ttl: number) => {
        const r = await store.acquire(key, lock);
        if (r.status !== 'acquired') throw new Error(`${key}: ${r.status}`);
        expect(await store.complete(key, r.token, response, ttl)).toBe(true);
      };
      // 'reused' expires soon, is evicted by four others, then comes back with a long ttl: the stale heap item
      // of its first life must not free the second.
      await completeWith('reused', 40);
      for (const k of ['e1', 'e2', 'e3', 'e4']) await completeWith(k, 60_000);
      expect(await store.get('reused')).toBeUndefined();
      await completeWith('reused', 60_000);
      // ttls out of order: the heap, not arrival order, decides.
      const many = new MemoryStore({ sweepInterval: 10 });
      const ttls = [60_000, 30, 60_000, 20, 60_000, 40];
      for (const [i, ttl] of ttls.entries()) {
        const r = await many.acquire(`t${i}`, lock);
        if (r.status === 'acquired') await many.complete(`t${i}`, r.token, response, ttl);
      }
      // A lease kept alive by renewals outlives its first lockTimeout; an abandoned one is freed.
      const kept = await many.acquire('kept', { fingerprint: 'f', lockTimeoutMs: 60 });
      await many.acquire('abandoned', { fingerprint: 'f', lockTimeoutMs: 60 });
      if (kept.status !== 'acquired') throw new Error('kept');
      for (let i = 0; i < 6; i++) {
        await jest.advanceTimersByTimeAsync(25);
        expect(await many.renew('kept', kept.token, 60)).toBe(true);
      }
      expect(many.size).toBe(4); // t0, t2, t4 and the renewed lease
      for (const i of [0, 2, 4]) expect((await many.get(`t${i}`))?.state).toBe('completed');
      expect((await many.get('kept'))?.state).toBe('in_progress');
      expect(await many.get('abandoned')).toBeUndefined();
      await jest.advanceTimersByTimeAsync(60);
      expect((await store.get('reused'))?.state).toBe('completed');
      expect(store.size).toBe(4);
      await store.close();
      await many.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('the sweep keeps records with steps, released or whose lease ran out, until ttlMs after their latest step', async () => {
    // Fake clock and timers, as above: a loaded machine cannot run past the steps' 400 ms before the first count.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore({ sweepInterval: 10 });
      const withStep = async (key: string, lockTimeoutMs: number) => {
        const r = await store.acquire(key, { fingerprint: 'f', lockTimeoutMs });
        if (r.status !== 'acquired') throw new Error(`${key}: ${r.status}`);
        expect(await store.recordStep(key, r.token, 'a', '"A"', 400)).toBe(true);
        return r.token;
      };
      expect(await store.release('released', await withStep('released', 30_000))).toBe(true);
      await withStep('lapsed', 30);
      // A record without steps is still removed by its release, and by the sweep once its lease ran out.
      const plain = await store.acquire('plain', lock);
      if (plain.status === 'acquired') expect(await store.release('plain', plain.token)).toBe(true);
      await store.acquire('plain-lapsed', { fingerprint: 'f', lockTimeoutMs: 30 });
      await jest.advanceTimersByTimeAsync(150);
      // Many sweeps ran since the lease ran out: both records with steps are still there, and nothing else.
      expect(store.size).toBe(2);
      for (const key of ['released', 'lapsed']) {
        expect(await store.get(key)).toMatchObject({ state: 'released', steps: { a: '"A"' } });
      }
      const resumed = await store.acquire('lapsed', lock);
      expect(resumed).toMatchObject({ status: 'acquired', steps: { a: '"A"' }, fingerprint: 'f' });
      if (resumed.status === 'acquired') expect(await store.release('lapsed', resumed.token)).toBe(true);
      await jest.advanceTimersByTimeAsync(400);
      expect(store.size).toBe(0);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('maxEntries bounds completed records only: released records with steps are neither counted nor evicted', async () => {
    const store = new MemoryStore({ maxEntries: 2 });
    const r = await store.acquire('resumable', lock);
    if (r.status !== 'acquired') throw new Error('expected a new key');
    expect(await store.recordStep('resumable', r.token, 'a', '"A"', 60_000)).toBe(true);
    expect(await store.release('resumable', r.token)).toBe(true);
    for (let i = 0; i < 5; i++) {
      const c = await store.acquire(`c${i}`, lock);
      if (c.status === 'acquired') await store.complete(`c${i}`, c.token, response, 60_000);
    }
    expect(store.size).toBe(3); // the two most recent completed records and the released one
    expect((await store.acquire('c4', lock)).status).toBe('completed');
    expect((await store.acquire('c3', lock)).status).toBe('completed');
    expect(await store.acquire('resumable', lock)).toMatchObject({ status: 'acquired', steps: { a: '"A"' } });
    await store.close();
  });

  test('a record does not keep alive the Buffer pool its body was sliced from', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const text = JSON.stringify({ id: 'ch_1', amount: 4200, currency: 'eur', note: 'n'.repeat(120) });
    // Array buffers are freed by a sweep that runs after the collection: give it a moment before reading.
    const collected = async () => {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 50));
      gc();
      return process.memoryUsage().arrayBuffers;
    };
    const heldBytes = async (store: MemoryStore, records: number) => {
      const before = await collected();
      for (let i = 0; i < records; i++) {
        const r = await store.acquire(`pool-${i}`, lock);
        if (r.status !== 'acquired') throw new Error('expected a new key');
        // As on a quiet server: the rest of each pool goes to allocations that die with their request.
        for (let j = 0; j < 60; j++) Buffer.from(text);
        await store.complete(
          `pool-${i}`,
          r.token,
          { status: 201, headers: {}, body: Buffer.from(text) },
          60_000,
        );
      }
      return ((await collected()) - before) / records;
    };
    const store = new MemoryStore();
    const perRecord = await heldBytes(store, 2_000);
    // 8 KB per record when each keeps its pool; the body's own bytes (and the slabs' last partial one) otherwise.
    expect(perRecord).toBeLessThan(2 * Buffer.byteLength(text));
    const replay = await store.acquire('pool-1999', lock);
    expect(replay.status === 'completed' && Buffer.from(replay.response.body).toString()).toBe(text);
    // A body that owns its buffer is copied too (its owner may reuse it), and an empty one stays empty.
    const own = new Uint8Array(Buffer.byteLength(text)).fill(7);
    const r = await store.acquire('own', lock);
    if (r.status === 'acquired')
      await store.complete('own', r.token, { status: 200, headers: {}, body: own }, 60_000);
    own.fill(8);
    const kept = await store.acquire('own', lock);
    expect(kept.status === 'completed' && kept.response.body.every((byte) => byte === 7)).toBe(true);
    const e = await store.acquire('empty', lock);
    if (e.status === 'acquired') {
      await store.complete('empty', e.token, { status: 204, headers: {}, body: Buffer.from('') }, 60_000);
    }
    const empty = await store.acquire('empty', lock);
    expect(empty.status === 'completed' && empty.response.body.byteLength).toBe(0);
    await store.close();
  });

  test('memory held follows maxEntries: evicted and deleted records free their bodies before their ttl', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const held = async () => {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 50));
      gc();
      return process.memoryUsage().arrayBuffers;
    };
    const store = new MemoryStore({ maxEntries: 10 });
    const before = await held();
    const body = () => new Uint8Array(100 * 1024).fill(1);
    for (let i = 0; i < 1000; i++) {
      const r = await store.acquire(`big-${i}`, lock);
      if (r.status !== 'acquired') throw new Error('expected a new key');
      await store.complete(`big-${i}`, r.token, { status: 200, headers: {}, body: body() }, 3_600_000);
    }
    expect(store.size).toBe(10);
    // 10 records of 100 KiB live; before, every evicted body (about 98 MiB) stayed until its ttl.
    expect((await held()) - before).toBeLessThan(4 * 1024 * 1024);
    for (let i = 990; i < 1000; i++) expect(await store.delete(`big-${i}`)).toBe(true);
    expect((await held()) - before).toBeLessThan(1024 * 1024);
    await store.close();
  });

  test('leases follow a monotonic clock: a wall-clock step neither ends a live lease nor a record', async () => {
    const store = new MemoryStore();
    const r = await store.acquire('stepped', lock);
    if (r.status !== 'acquired') throw new Error('expected a new key');
    const done = await store.acquire('done', lock);
    if (done.status === 'acquired') await store.complete('done', done.token, response, 60_000);
    const wall = Date.now();
    // NTP or a resumed VM moves the wall clock an hour ahead.
    const now = jest.spyOn(Date, 'now').mockImplementation(() => wall + 3_600_000);
    try {
      expect((await store.acquire('stepped', lock)).status).toBe('in_progress');
      expect((await store.acquire('done', lock)).status).toBe('completed');
      expect(await store.renew('stepped', r.token, 30_000)).toBe(true);
      // get() still answers in epoch milliseconds, on the (stepped) wall clock.
      const record = await store.get('stepped');
      expect(record?.lockExpiresAt).toBeGreaterThan(wall + 3_600_000 + 29_000);
      expect(record?.lockExpiresAt).toBeLessThanOrEqual(wall + 3_600_000 + 30_001);
      expect(await store.complete('stepped', r.token, response, 60_000)).toBe(true);
    } finally {
      now.mockRestore();
    }
    await store.close();
  });

  test('options are validated with the option name in the error', () => {
    expect(() => new MemoryStore({ maxEntries: 0 })).toThrow(/maxEntries/);
    expect(() => new MemoryStore({ sweepInterval: 'soon' as never })).toThrow(/sweepInterval/);
  });
});

test('keys() lists the records held, leaving out those whose time ran out', async () => {
  const store = new MemoryStore();
  await store.acquire('short', { fingerprint: 'f', lockTimeoutMs: 1 });
  await store.acquire('long', { fingerprint: 'f', lockTimeoutMs: 30_000 });
  await new Promise((resolve) => setTimeout(resolve, 10));
  expect([...store.keys()]).toEqual(['long']);
});

describe('MemoryStore under jest fake timers (what docs/options.md tells users)', () => {
  const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
  const response = { status: 201, headers: {}, body: Buffer.from('ok') };
  async function completed(store: MemoryStore, key: string, ttlMs: number): Promise<void> {
    const acquired = await store.acquire(key, lock);
    if (acquired.status !== 'acquired') throw new Error('expected a new key');
    await store.complete(key, acquired.token, response, ttlMs);
  }

  afterEach(() => {
    jest.useRealTimers();
  });

  test('with every timer faked, a store call answers only when fake time moves (it answers on setImmediate)', async () => {
    jest.useFakeTimers();
    const store = new MemoryStore();
    let answered = false;
    const pending = store.acquire('k', lock).then((result) => {
      answered = true;
      return result;
    });
    for (let i = 0; i < 10; i++) await Promise.resolve();
    expect(answered).toBe(false);
    jest.advanceTimersByTime(0);
    expect((await pending).status).toBe('acquired');
    await store.close();
  });

  test('jest.setSystemTime does not expire a record: ttl follows performance.now, which it leaves alone', async () => {
    jest.useFakeTimers({ doNotFake: ['setImmediate'] });
    const store = new MemoryStore();
    await completed(store, 'k', 1000);
    jest.setSystemTime(Date.now() + 60_000);
    expect((await store.acquire('k', lock)).status).toBe('completed');
    await store.close();
  });

  test('jest.advanceTimersByTime expires it: modern fake timers fake performance.now too', async () => {
    jest.useFakeTimers({ doNotFake: ['setImmediate'] });
    const store = new MemoryStore();
    await completed(store, 'k', 1000);
    jest.advanceTimersByTime(999);
    expect((await store.acquire('k', lock)).status).toBe('completed');
    jest.advanceTimersByTime(2);
    expect((await store.acquire('k', lock)).status).toBe('acquired');
    await store.close();
  });

  test("with doNotFake: ['performance'] too, advancing fake time expires nothing", async () => {
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'performance'] });
    const store = new MemoryStore();
    await completed(store, 'k', 1000);
    jest.advanceTimersByTime(60_000);
    expect((await store.acquire('k', lock)).status).toBe('completed');
    await store.close();
  });
});
