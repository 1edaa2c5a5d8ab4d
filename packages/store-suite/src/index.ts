/**
 * The conformance suite of oncely's `IdempotencyStore`: {@link storeSuite} runs it on your own store, with jest,
 * vitest, mocha or `node:test`.
 *
 * @module @oncely/store-suite
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { IdempotencyStore, StoredResponse } from '@oncely/core';
import { stepsTests } from './steps';
import { onTime } from './timing';

/**
 * The four functions the suite needs from your test runner. It calls no globals, so any runner that has them works:
 * `node:test` and mocha as they are (`{ describe, test, before, after }`, mocha's `it` as `test`), jest and vitest
 * with `before: beforeAll, after: afterAll`.
 */
export interface TestRunner {
  /** Groups tests: `body` declares them, synchronously. */
  describe(name: string, body: () => void): unknown;
  /** Declares one test: it passes when `body` resolves, and fails when it rejects. */
  test(name: string, body: () => Promise<void>): unknown;
  /** Runs once before the suite's tests (jest's and vitest's `beforeAll`). */
  before(body: () => Promise<void>): unknown;
  /** Runs once after them (`afterAll`). */
  after(body: () => Promise<void>): unknown;
}

/** Options of {@link storeSuite}: how to name the suite, and make and tear down the store under test. */
export interface StoreSuiteOptions {
  /** Names the suite: `<name>: store contract`. */
  name: string;
  /** Creates the store under test; called once, before the suite's tests. */
  create(): Promise<IdempotencyStore> | IdempotencyStore;
  /** Tears it down after them. Default: `store.close?.()`. */
  destroy?(store: IdempotencyStore): Promise<void> | void;
  /**
   * The shortest lease and TTL the tests use, in ms; the tests that wait for one to run out sleep three or four
   * times this, and a check that must come before one runs out makes up to four round trips within it (a late
   * attempt is run again, up to five times). A store whose expiry is coarse (a clock in seconds, a server's expiry
   * sweep) or whose round trips are slow wants more. Default: `150`.
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

/** Equal bytes, or an error that says where they first differ. */
function assertSameBytes(actual: Uint8Array, expected: Uint8Array): void {
  if (Buffer.from(actual).equals(Buffer.from(expected))) return;
  let at = 0;
  while (at < actual.byteLength && at < expected.byteLength && actual[at] === expected[at]) at++;
  assert.fail(
    `body differs: ${actual.byteLength} bytes, expected ${expected.byteLength}; first difference at byte ${at}`,
  );
}

/**
 * The conformance suite of `IdempotencyStore`: the atomic steps (`acquire`, `complete`, `release`, `renew`), their
 * fencing, leases and TTLs, and `get`, `delete` and `waitFor` where the store has them; and, where the store has
 * `recordStep`, recorded steps: their fencing, the `released` state, resuming, expiry. On a store without
 * `recordStep` those tests pass without checking anything, and the suite says so once (a runner-agnostic suite
 * cannot mark a test skipped). Every store of the oncely repository runs it. Each test uses fresh random keys, so a store that shares a server with other tests never
 * needs a flush. Assertions are `node:assert`'s: any runner reports them as failures.
 *
 * ```ts
 * import { after, before, describe, test } from 'node:test';
 * storeSuite({ describe, test, before, after }, { name: 'MyStore', create: () => new MyStore() });
 * ```
 */
export function storeSuite(runner: TestRunner, options: StoreSuiteOptions): void {
  const { describe, test, before, after } = runner;
  const shortMs = options.shortMs ?? 150;

  describe(`${options.name}: store contract`, () => {
    let store: IdempotencyStore;
    const key = (label = 'k') => `suite:${randomUUID()}:${label}`;
    const lock = { fingerprint: 'fp-1', lockTimeoutMs: 30_000 };

    before(async () => {
      store = await options.create();
    });
    after(async () => {
      if (options.destroy) await options.destroy(store);
      else await store.close?.();
    });

    test('acquire on a new key hands out a token', async () => {
      const result = await store.acquire(key(), lock);
      assert.equal(result.status, 'acquired');
      if (result.status === 'acquired') assert.equal(typeof result.token, 'string');
    });

    test('100 concurrent acquires on one key: exactly one is acquired, the rest see it in progress', async () => {
      const k = key();
      const results = await Promise.all(Array.from({ length: 100 }, () => store.acquire(k, lock)));
      const acquired = results.filter((r) => r.status === 'acquired');
      const inProgress = results.filter((r) => r.status === 'in_progress');
      assert.equal(acquired.length, 1);
      assert.equal(inProgress.length, 99);
      for (const r of inProgress) {
        if (r.status !== 'in_progress') throw new Error('unreachable');
        assert.equal(r.fingerprint, 'fp-1');
        assert.ok(r.retryAfterMs > 0, `retryAfterMs ${r.retryAfterMs} must be above 0`);
        assert.ok(
          r.retryAfterMs <= 30_000,
          `retryAfterMs ${r.retryAfterMs} must be at most the lease (30000)`,
        );
      }
    });

    test('an in_progress answer writes nothing: the holder keeps its fingerprint, lease and token', async () => {
      const k = key();
      const held = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: 30_000 });
      if (held.status !== 'acquired') throw new Error(`expected acquired, got ${held.status}`);
      await sleep(shortMs);
      const first = await store.acquire(k, { fingerprint: 'fp-2', lockTimeoutMs: 60_000 });
      if (first.status !== 'in_progress') throw new Error(`expected in_progress, got ${first.status}`);
      assert.equal(first.fingerprint, 'fp-1');
      const second = await store.acquire(k, { fingerprint: 'fp-3', lockTimeoutMs: 60_000 });
      if (second.status !== 'in_progress') throw new Error(`expected in_progress, got ${second.status}`);
      assert.equal(second.fingerprint, 'fp-1', 'an in_progress answer changed the stored fingerprint');
      // A store that wrote the caller's lease would answer close to 60000 now.
      assert.ok(
        second.retryAfterMs <= first.retryAfterMs + 10,
        `the lease grew after an in_progress answer: ${first.retryAfterMs} then ${second.retryAfterMs} ms`,
      );
      assert.equal(await store.complete(k, held.token, response(binaryBody(5)), 60_000), true);
      const done = await store.acquire(k, { fingerprint: 'fp-4', lockTimeoutMs: 30_000 });
      if (done.status !== 'completed') throw new Error(`expected completed, got ${done.status}`);
      assert.equal(done.fingerprint, 'fp-1', 'an in_progress answer changed the stored fingerprint');
      assert.equal(done.response.body.byteLength, 5);
    });

    test("retryAfterMs is the lease's remaining time", async () => {
      const k = key();
      const started = Date.now();
      const held = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: 30_000 });
      const acquiredBy = Date.now();
      if (held.status !== 'acquired') throw new Error(`expected acquired, got ${held.status}`);
      await sleep(shortMs * 2);
      const asked = Date.now();
      const answer = await store.acquire(k, lock);
      const answered = Date.now();
      if (answer.status !== 'in_progress') throw new Error(`expected in_progress, got ${answer.status}`);
      // The lease began between `started` and `acquiredBy` and was read between `asked` and `answered`; a store
      // whose expiry is coarse gets half of shortMs either side.
      const slack = Math.max(20, shortMs / 2);
      const most = acquiredBy + 30_000 - asked + slack;
      const least = started + 30_000 - answered - slack;
      assert.ok(
        answer.retryAfterMs >= least && answer.retryAfterMs <= most,
        `retryAfterMs ${answer.retryAfterMs} must be the lease's remaining time, between ${least} and ${most}`,
      );
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
      assert.equal(owners.size, 20);
      assert.ok(
        [...owners.values()].every((count) => count === 1),
        `owners per key: ${[...owners.values()].join(', ')}`,
      );
    });

    test('complete stores the response; acquire then returns it with the fingerprint, byte for byte', async () => {
      const k = key();
      const acquired = await store.acquire(k, { fingerprint: 'fp-original', lockTimeoutMs: 30_000 });
      if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
      const sent = response(binaryBody(4096));
      assert.equal(await store.complete(k, acquired.token, sent, 60_000), true);
      const again = await store.acquire(k, { fingerprint: 'fp-other', lockTimeoutMs: 30_000 });
      assert.equal(again.status, 'completed');
      if (again.status !== 'completed') return;
      assert.equal(again.fingerprint, 'fp-original');
      assert.equal(again.response.status, 201);
      assert.deepEqual({ ...again.response.headers }, sent.headers);
      assertSameBytes(again.response.body, sent.body);
    });

    test('an empty body and a large (512 KiB) binary body round-trip', async () => {
      for (const body of [new Uint8Array(0), binaryBody(512 * 1024)]) {
        const k = key();
        const acquired = await store.acquire(k, lock);
        if (acquired.status !== 'acquired') throw new Error('expected acquired');
        assert.equal(
          await store.complete(k, acquired.token, { status: 200, headers: {}, body }, 60_000),
          true,
        );
        const again = await store.acquire(k, lock);
        if (again.status !== 'completed') throw new Error(`expected completed, got ${again.status}`);
        assert.equal(again.response.body.byteLength, body.byteLength);
        assertSameBytes(again.response.body, body);
      }
    });

    test('a stored response is a copy: changing what was given to complete, or a replay, changes no later replay', async () => {
      const k = key();
      const acquired = await store.acquire(k, lock);
      if (acquired.status !== 'acquired') throw new Error('expected acquired');
      // A handler's own buffer and headers, which it reuses for its next request.
      const body = binaryBody(600);
      const headers = { 'content-type': 'application/octet-stream', link: ['<a>', '<b>'] };
      assert.equal(await store.complete(k, acquired.token, { status: 200, headers, body }, 60_000), true);
      body.fill(0x42);
      headers.link.push('<c>');
      const expectStored = async () => {
        const replay = await store.acquire(k, lock);
        if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
        assertSameBytes(replay.response.body, binaryBody(600));
        assert.deepEqual(replay.response.headers.link, ['<a>', '<b>']);
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
      for (const k of keys) assert.equal((await store.acquire(k, lock)).status, 'acquired', `key ${k}`);
    });

    test('a wrong token can neither complete, release nor renew', async () => {
      const k = key();
      const acquired = await store.acquire(k, lock);
      if (acquired.status !== 'acquired') throw new Error('expected acquired');
      const wrong = `${acquired.token}-not`;
      assert.equal(await store.complete(k, wrong, response(), 60_000), false);
      assert.equal(await store.release(k, wrong), false);
      assert.equal(await store.renew(k, wrong, 30_000), false);
      assert.equal((await store.acquire(k, lock)).status, 'in_progress');
      assert.equal(await store.complete(k, acquired.token, response(), 60_000), true);
    });

    test('release frees the key: the next acquire gets a new token', async () => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      assert.equal(await store.release(k, first.token), true);
      assert.equal(await store.release(k, first.token), false);
      const second = await store.acquire(k, lock);
      if (second.status !== 'acquired') throw new Error(`expected acquired, got ${second.status}`);
      assert.notEqual(second.token, first.token);
    });

    test('a completed record cannot be completed again, released or renewed', async () => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      assert.equal(await store.complete(k, first.token, response(binaryBody(10)), 60_000), true);
      assert.equal(await store.complete(k, first.token, response(binaryBody(20)), 60_000), false);
      assert.equal(await store.release(k, first.token), false);
      assert.equal(await store.renew(k, first.token, 30_000), false);
      const again = await store.acquire(k, lock);
      if (again.status !== 'completed') throw new Error(`expected completed, got ${again.status}`);
      assert.equal(again.response.body.byteLength, 10);
    });

    test('an expired lease is taken over with a new token; the stale token is fenced off', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      await sleep(shortMs * 3);
      const second = await store.acquire(k, { fingerprint: 'fp-2', lockTimeoutMs: 30_000 });
      if (second.status !== 'acquired') throw new Error(`expected a takeover, got ${second.status}`);
      assert.notEqual(second.token, first.token);
      assert.equal(await store.complete(k, first.token, response(binaryBody(1)), 60_000), false);
      assert.equal(await store.renew(k, first.token, 30_000), false);
      assert.equal(await store.release(k, first.token), false);
      const during = await store.acquire(k, lock);
      assert.equal(during.status, 'in_progress');
      if (during.status === 'in_progress') assert.equal(during.fingerprint, 'fp-2');
      assert.equal(await store.complete(k, second.token, response(binaryBody(2)), 60_000), true);
      const done = await store.acquire(k, lock);
      if (done.status !== 'completed') throw new Error('expected completed');
      assert.equal(done.response.body.byteLength, 2);
    });

    test('a lease that ran out cannot be completed even if nobody took it over', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      await sleep(shortMs * 3);
      assert.equal(await store.complete(k, first.token, response(), 60_000), false);
      assert.equal((await store.acquire(k, lock)).status, 'acquired');
    });

    test('a lease that ran out cannot be renewed or released even if nobody took it over', async () => {
      const k = key();
      const first = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      await sleep(shortMs * 3);
      assert.equal(await store.renew(k, first.token, 30_000), false, 'renew revived a lease that ran out');
      assert.equal(await store.release(k, first.token), false);
      assert.equal(await store.complete(k, first.token, response(), 60_000), false);
      const next = await store.acquire(k, lock);
      if (next.status !== 'acquired') throw new Error(`expected acquired, got ${next.status}`);
      assert.notEqual(next.token, first.token);
    });

    test('renew extends a live lease', () =>
      onTime(async (within) => {
        const k = key();
        const first = await within('renew within the lease', shortMs * 2, async () => {
          const held = await store.acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: shortMs * 2 });
          if (held.status !== 'acquired') throw new Error('expected acquired');
          assert.equal(await store.renew(k, held.token, 30_000), true);
          return held;
        });
        await sleep(shortMs * 4);
        const during = await store.acquire(k, lock);
        assert.equal(during.status, 'in_progress');
        assert.equal(await store.complete(k, first.token, response(), 60_000), true);
      }));

    test('a completed record expires after its TTL and the key is new again', () =>
      onTime(async (within) => {
        const k = key();
        const first = await store.acquire(k, lock);
        if (first.status !== 'acquired') throw new Error('expected acquired');
        await within('replay within the TTL', shortMs, async () => {
          assert.equal(await store.complete(k, first.token, response(), shortMs), true);
          assert.equal((await store.acquire(k, lock)).status, 'completed');
        });
        await sleep(shortMs * 3);
        assert.equal((await store.acquire(k, lock)).status, 'acquired');
      }));

    test('get and delete, when the store has them, see and remove the live record', async () => {
      if (!store.get || !store.delete) return;
      const k = key();
      assert.equal(await store.get(k), undefined);
      const first = await store.acquire(k, { fingerprint: 'fp-get', lockTimeoutMs: 30_000 });
      if (first.status !== 'acquired') throw new Error('expected acquired');
      const live = await store.get(k);
      assert.equal(live?.state, 'in_progress');
      assert.equal(live?.fingerprint, 'fp-get');
      assert.equal(live?.token, first.token);
      assert.ok(
        (live?.lockExpiresAt ?? 0) > Date.now() - 5_000,
        `lockExpiresAt ${live?.lockExpiresAt} must be epoch milliseconds of a live lease`,
      );
      await store.complete(k, first.token, response(binaryBody(3)), 60_000);
      const done = await store.get(k);
      assert.equal(done?.state, 'completed');
      assert.equal(done?.response?.body.byteLength, 3);
      assert.equal(await store.delete(k), true);
      assert.equal(await store.get(k), undefined);
      assert.equal(await store.delete(k), false);
      assert.equal((await store.acquire(k, lock)).status, 'acquired');
    });

    test('get and delete, when the store has them, see no record whose lease or TTL ran out', async () => {
      if (!store.get || !store.delete) return;
      const lease = key('lease');
      const done = key('done');
      assert.equal(
        (await store.acquire(lease, { fingerprint: 'fp-1', lockTimeoutMs: shortMs })).status,
        'acquired',
      );
      const first = await store.acquire(done, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      assert.equal(await store.complete(done, first.token, response(), shortMs), true);
      await sleep(shortMs * 3);
      for (const k of [lease, done]) {
        assert.equal(await store.get(k), undefined);
        assert.equal(await store.delete(k), false, 'delete found a record whose lease or TTL ran out');
      }
    });

    /**
     * Holds a new key, waits on it, checks the waiter sleeps while the lease is live, then ends the lease with
     * `end` and checks the waiter wakes. Resolves to the key.
     */
    const wakesWhen = async (
      what: string,
      end: (k: string, token: string) => Promise<unknown>,
      waitFor: NonNullable<IdempotencyStore['waitFor']>,
    ): Promise<string> => {
      const k = key();
      const first = await store.acquire(k, lock);
      if (first.status !== 'acquired') throw new Error('expected acquired');
      let woke = false;
      const waiting = waitFor(k, 20_000).then(() => {
        woke = true;
      });
      await sleep(shortMs);
      assert.equal(woke, false, `waitFor resolved while the lease was live, before ${what}`);
      await end(k, first.token);
      const started = Date.now();
      await waiting;
      // Generous bound: a waiter that only woke at its 20s timeout would fail this.
      assert.ok(Date.now() - started < 10_000, `waitFor did not wake on ${what}`);
      assert.equal(woke, true);
      return k;
    };

    test('waitFor, when the store has it, wakes a waiter when the record completes', async () => {
      if (!store.waitFor) return;
      const waitFor = store.waitFor.bind(store);
      await wakesWhen('completion', (k, token) => store.complete(k, token, response(), 60_000), waitFor);
      // Not held at all: resolves at once.
      await waitFor(key('free'), 20_000);
    });

    test('waitFor, when the store has it, wakes a waiter when the lease is released', async () => {
      if (!store.waitFor) return;
      const k = await wakesWhen(
        'release',
        async (k, token) => assert.equal(await store.release(k, token), true),
        store.waitFor.bind(store),
      );
      assert.equal((await store.acquire(k, lock)).status, 'acquired');
    });

    let noted = false;
    describe('recordStep, when the store has it', () => {
      stepsTests({
        test,
        store: () => store,
        key,
        shortMs,
        noteSkipped() {
          if (noted) return;
          noted = true;
          console.warn(
            `@oncely/store-suite: ${options.name} has no recordStep, so its recordStep tests checked nothing ` +
              '(step() is refused on this store). Implement recordStep to run them.',
          );
        },
      });
    });
  });
}
