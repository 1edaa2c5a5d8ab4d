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
    const store = new MemoryStore({ sweepInterval: 20 });
    for (let i = 0; i < 50; i++) {
      const r = await store.acquire(`k${i}`, lock);
      if (r.status === 'acquired') await store.complete(`k${i}`, r.token, response, 30);
    }
    await store.acquire('lease', { fingerprint: 'f', lockTimeoutMs: 30 });
    expect(store.size).toBe(51);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(store.size).toBe(0);
    await store.close();
  });

  test('options are validated with the option name in the error', () => {
    expect(() => new MemoryStore({ maxEntries: 0 })).toThrow(/maxEntries/);
    expect(() => new MemoryStore({ sweepInterval: 'soon' })).toThrow(/sweepInterval/);
  });
});
