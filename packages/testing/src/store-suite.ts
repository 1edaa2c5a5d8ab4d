import { randomUUID } from 'node:crypto';
import type { IdempotencyStore, StoredResponse } from '@oncely/core';

export interface StoreSuiteOptions {
  /** Creates the store under test; called once per test file (beforeAll). */
  create(): Promise<IdempotencyStore> | IdempotencyStore;
  /** Tears it down (afterAll). Defaults to `store.close?.()`. */
  destroy?(store: IdempotencyStore): Promise<void> | void;
  /**
   * The shortest lease/TTL the tests may use, in ms. Networked stores with coarse clocks want more.
   * Default: 150.
   */
  shortMs?: number;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every byte value, twice, plus bytes that are invalid UTF-8: proves bodies are bytes, not text. */
export function binaryBody(size = 512): Uint8Array {
  const body = new Uint8Array(size);
  for (let i = 0; i < size; i++) body[i] = i % 256;
  return body;
}

function response(body: Uint8Array = binaryBody()): StoredResponse {
  return {
    status: 201,
    headers: { 'content-type': 'application/octet-stream', 'x-multi': ['a', 'b'], etag: '"abc"' },
    body,
  };
}

/**
 * The store contract (the atomic steps of `IdempotencyStore`), run against any store. Each test uses fresh random keys, so stores that share a
 * server with other tests never need a flush.
 */
export function storeContractSuite(name: string, options: StoreSuiteOptions): void {
  const shortMs = options.shortMs ?? 150;

  describe(`${name}: store contract`, () => {
    let store: IdempotencyStore;
    const key = (label = 'k') => `suite:${randomUUID()}:${label}`;
    const lock = { fingerprint: 'fp-1', lockTimeoutMs: 30_000 };

    beforeAll(async () => {
      store = await options.create();
    });
    afterAll(async () => {
      if (options.destroy) await options.destroy(store);
      else await store.close?.();
    });

    test('acquire on a new key hands out a token', async () => {
      const result = await store.acquire(key(), lock);
      expect(result.status).toBe('acquired');
      if (result.status === 'acquired') expect(typeof result.token).toBe('string');
    });

    test('100 concurrent acquires on one key: exactly one is acquired, the rest see it in progress', async () => {
      const k = key();
      const results = await Promise.all(Array.from({ length: 100 }, () => store.acquire(k, lock)));
      const acquired = results.filter((r) => r.status === 'acquired');
      const inProgress = results.filter((r) => r.status === 'in_progress');
      expect(acquired).toHaveLength(1);
      expect(inProgress).toHaveLength(99);
      for (const r of inProgress) {
        if (r.status !== 'in_progress') throw new Error('unreachable');
        expect(r.fingerprint).toBe('fp-1');
        expect(r.retryAfterMs).toBeGreaterThan(0);
        expect(r.retryAfterMs).toBeLessThanOrEqual(30_000);
      }
    });

    test('100 concurrent acquires over 20 keys: exactly one owner per key', async () => {
      const keys = Array.from({ length: 20 }, (_, i) => key(`multi-${i}`));
      const results = await Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          store.acquire(keys[i % 20] as string, lock).then((r) => [i % 20, r] as const),
        ),
      );
      const owners = new Map<number, number>();
      for (const [k, r] of results) if (r.status === 'acquired') owners.set(k, (owners.get(k) ?? 0) + 1);
      expect(owners.size).toBe(20);
      expect([...owners.values()].every((count) => count === 1)).toBe(true);
    });

    test('complete stores the response; acquire then returns it with the fingerprint, byte for byte', async () => {
      const k = key();
      const acquired = await store.acquire(k, { fingerprint: 'fp-original', lockTimeoutMs: 30_000 });
      if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
      const sent = response(binaryBody(4096));
      expect(await store.complete(k, acquired.token, sent, 60_000)).toBe(true);
      const again = await store.acquire(k, { fingerprint: 'fp-other', lockTimeoutMs: 30_000 });
      expect(again.status).toBe('completed');
      if (again.status !== 'completed') return;
      expect(again.fingerprint).toBe('fp-original');
      expect(again.response.status).toBe(201);
      expect(again.response.headers).toEqual(sent.headers);
      expect(Buffer.from(again.response.body).equals(Buffer.from(sent.body))).toBe(true);
    });

    test('an empty body and a large (512 KiB) binary body round-trip', async () => {
      for (const body of [new Uint8Array(0), binaryBody(512 * 1024)]) {
        const k = key();
        const acquired = await store.acquire(k, lock);
        if (acquired.status !== 'acquired') throw new Error('expected acquired');
        expect(await store.complete(k, acquired.token, { status: 200, headers: {}, body }, 60_000)).toBe(
          true,
        );
        const again = await store.acquire(k, lock);
        if (again.status !== 'completed') throw new Error(`expected completed, got ${again.status}`);
        expect(again.response.body.byteLength).toBe(body.byteLength);
        expect(Buffer.from(again.response.body).equals(Buffer.from(body))).toBe(true);
      }
    });

    test('a stored response is a copy: changing what was given to complete, or a replay, changes no later replay', async () => {
      const k = key();
      const acquired = await store.acquire(k, lock);
      if (acquired.status !== 'acquired') throw new Error('expected acquired');
      // A handler's own buffer and headers, which it reuses for its next request.
      const body = binaryBody(600);
      const headers = { 'content-type': 'application/octet-stream', link: ['<a>', '<b>'] };
      expect(await store.complete(k, acquired.token, { status: 200, headers, body }, 60_000)).toBe(true);
      body.fill(0x42);
      headers.link.push('<c>');
      const expectStored = async () => {
        const replay = await store.acquire(k, lock);
        if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
        expect(Buffer.from(replay.response.body).equals(Buffer.from(binaryBody(600)))).toBe(true);
        expect(replay.response.headers.link).toEqual(['<a>', '<b>']);
        return replay.response;
      };
      const replay = await expectStored();
      // Whoever receives a replay (an outer middleware, a framework hook) writes into it.
      replay.body.fill(0x43);
      try {
        (replay.headers.link as string[]).push('<d>');
      } catch {
        // A store may hand out frozen headers.
      }
      await expectStored();
      if (store.get !== undefined) {
        const record = await store.get(k);
        record?.response?.body.fill(0x44);
        await expectStored();
      }
    });

    test('keys with spaces, braces and non-ASCII scopes are distinct records', async () => {
      const base = randomUUID();
      const keys = [
        `tenant {a} ${base}`,
        `tenant {b} ${base}`,
        `{}tenant {a} ${base}`,
        `{a}${base}`,
        `{}{a}${base}`,
        `tenänt ${base}`,
        `${base}`,
      ];
      for (const k of keys) expect((await store.acquire(k, lock)).status).toBe('acquired');
    });

    test('a wrong token can neither complete, release nor renew', async () => {
      const k = key();
      const acquired = await store.acquire(k, lock);
      if (acquired.status !== 'acquired') throw new Error('expected acquired');
      const wrong = `${acquired.token}-not`;
      expect(await store.complete(k, wrong, response(), 60_000)).toBe(false);
      expect(await store.release(k, wrong)).toBe(false);
      expect(await store.renew(k, wrong, 30_000)).toBe(false);
      expect((await store.acquire(k, lock)).status).toBe('in_progress');
      expect(await store.complete(k, acquired.token, response(), 60_000)).toBe(true);
    });

    test('release frees the key: the next acquire gets a new token', async () => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      expect(await store.release(k, first.token)).toBe(true);
      expect(await store.release(k, first.token)).toBe(false);
      const second = await store.acquire(k, lock);
      if (second.status !== 'acquired') throw new Error(`expected acquired, got ${second.status}`);
      expect(second.token).not.toBe(first.token);
    });

    test('a completed record cannot be completed again, released or renewed', async () => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      expect(await store.complete(k, first.token, response(binaryBody(10)), 60_000)).toBe(true);
      expect(await store.complete(k, first.token, response(binaryBody(20)), 60_000)).toBe(false);
      expect(await store.release(k, first.token)).toBe(false);
      expect(await store.renew(k, first.token, 30_000)).toBe(false);
      const again = await store.acquire(k, lock);
      if (again.status !== 'completed') throw new Error(`expected completed, got ${again.status}`);
      expect(again.response.body.byteLength).toBe(10);
    });

    test('an expired lease is taken over with a new token; the stale token is fenced off', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      await sleep(shortMs * 3);
      const second = await store.acquire(k, { fingerprint: 'fp-2', lockTimeoutMs: 30_000 });
      if (second.status !== 'acquired') throw new Error(`expected a takeover, got ${second.status}`);
      expect(second.token).not.toBe(first.token);
      expect(await store.complete(k, first.token, response(binaryBody(1)), 60_000)).toBe(false);
      expect(await store.renew(k, first.token, 30_000)).toBe(false);
      expect(await store.release(k, first.token)).toBe(false);
      const during = await store.acquire(k, lock);
      expect(during.status).toBe('in_progress');
      if (during.status === 'in_progress') expect(during.fingerprint).toBe('fp-2');
      expect(await store.complete(k, second.token, response(binaryBody(2)), 60_000)).toBe(true);
      const done = await store.acquire(k, lock);
      if (done.status !== 'completed') throw new Error('expected completed');
      expect(done.response.body.byteLength).toBe(2);
    });

    test('a lease that ran out cannot be completed even if nobody took it over', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      await sleep(shortMs * 3);
      expect(await store.complete(k, first.token, response(), 60_000)).toBe(false);
      expect((await store.acquire(k, lock)).status).toBe('acquired');
    });

    test('renew extends a live lease', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs * 2 });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      expect(await store.renew(k, first.token, 30_000)).toBe(true);
      await sleep(shortMs * 4);
      const during = await store.acquire(k, lock);
      expect(during.status).toBe('in_progress');
      expect(await store.complete(k, first.token, response(), 60_000)).toBe(true);
    });

    test('a completed record expires after its TTL and the key is new again', async () => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      expect(await store.complete(k, first.token, response(), shortMs)).toBe(true);
      expect((await store.acquire(k, lock)).status).toBe('completed');
      await sleep(shortMs * 3);
      expect((await store.acquire(k, lock)).status).toBe('acquired');
    });

    test('get and delete, when the store has them, see and remove the live record', async () => {
      if (!store.get || !store.delete) return;
      const k = key();
      expect(await store.get(k)).toBeUndefined();
      const first = await store.acquire(k, { fingerprint: 'fp-get', lockTimeoutMs: 30_000 });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      const live = await store.get(k);
      expect(live).toMatchObject({ state: 'in_progress', fingerprint: 'fp-get', token: first.token });
      expect(live?.lockExpiresAt).toBeGreaterThan(Date.now() - 5_000);
      await store.complete(k, first.token, response(binaryBody(3)), 60_000);
      const done = await store.get(k);
      expect(done?.state).toBe('completed');
      expect(done?.response?.body.byteLength).toBe(3);
      expect(await store.delete(k)).toBe(true);
      expect(await store.get(k)).toBeUndefined();
      expect((await store.acquire(k, lock)).status).toBe('acquired');
    });

    test('waitFor, when the store has it, wakes a waiter when the record completes', async () => {
      if (!store.waitFor) return;
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      let woke = false;
      const waiting = store.waitFor(k, 20_000).then(() => {
        woke = true;
      });
      await sleep(shortMs);
      expect(woke).toBe(false);
      await store.complete(k, first.token, response(), 60_000);
      const started = Date.now();
      await waiting;
      // Generous bound: a waiter that only woke at its 20s timeout would fail this.
      expect(Date.now() - started).toBeLessThan(10_000);
      expect(woke).toBe(true);
      // Not held at all: resolves at once.
      await store.waitFor(key('free'), 20_000);
    });
  });
}
