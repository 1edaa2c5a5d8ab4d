/**
 * @services redis
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { OncelyError, StoreOperationError } from '@oncely/core';
import Redis from 'ioredis';
import { RedisStore } from '../src';
import { parseAcquire } from '../src/replies';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { LEGACY_ACQUIRE, LEGACY_COMPLETE, LEGACY_RELEASE } from './fixtures/hash-layout';
import { V2_ACQUIRE, V2_COMPLETE } from './fixtures/string-layout-v2';

// Rolling deploys: servers still on the version before the string layout (2026-11-24) write hash records with the
// scripts of that version (fixtures/hash-layout.ts, verbatim); the current store must read them until they expire,
// on every client. Each test plays "the old server" with those scripts on an ioredis connection of its own.

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-layout-${randomBytes(4).toString('hex')}:`;
const channel = `${prefix}completed`;
let old: Redis;

beforeAll(() => {
  old = new Redis(url);
});
afterAll(async () => {
  const keys = await old.keys(`${prefix}*`);
  if (keys.length > 0) await old.del(...keys);
  await old.quit();
});

/** The old version's acquire and complete, as its RedisStore sent them. */
const oldServer = {
  async acquire(key: string, fingerprint: string, lockTimeoutMs = 30_000): Promise<string> {
    const token = randomUUID();
    const reply = (await old.eval(LEGACY_ACQUIRE, 1, prefix + key, fingerprint, lockTimeoutMs, token)) as [
      string,
    ];
    if (reply[0] !== 'a') throw new Error(`the old server did not acquire ${key}`);
    return token;
  },
  async complete(key: string, token: string, status: number, headers: object, body: Buffer): Promise<void> {
    const reply = await old.eval(
      LEGACY_COMPLETE,
      1,
      prefix + key,
      token,
      status,
      JSON.stringify(headers),
      body,
      86_400_000,
      channel,
    );
    if (reply !== 1) throw new Error(`the old server could not complete ${key}`);
  },
  async release(key: string, token: string): Promise<void> {
    await old.eval(LEGACY_RELEASE, 1, prefix + key, token, channel);
  },
};

// Every byte value, colons included: the new layout finds its fields by lengths, not by scanning the body.
const body = Buffer.from(Array.from({ length: 600 }, (_, i) => i % 256));
const headers = { 'content-type': 'application/octet-stream', 'set-cookie': ['a=1', 'b=2'], etag: '"v1:2"' };

test('a reply the store does not know is an OncelyError, not a plain Error', () => {
  expect(() => parseAcquire('weird', 'unused')).toThrow(StoreOperationError);
  expect(() => parseAcquire('weird', 'unused')).toThrow(OncelyError);
});

describe.each(CLIENT_KINDS)('$name', (kind) => {
  let connected: ConnectedClient;
  let store: RedisStore;
  const k = (name: string) => `${kind.name.replace(/\W/g, '')}-${name}`;

  beforeAll(async () => {
    connected = await kind.standalone(url);
    store = new RedisStore({ client: connected.client, prefix });
  });
  afterAll(async () => {
    await store.close();
    await connected.close();
  });

  test('a completed record of the hash layout is replayed as it was stored', async () => {
    const token = await oldServer.acquire(k('done'), 'fp:old');
    await oldServer.complete(k('done'), token, 201, headers, body);
    expect(await old.type(prefix + k('done'))).toBe('hash');

    const result = await store.acquire(k('done'), { fingerprint: 'fp:new', lockTimeoutMs: 30_000 });
    expect(result).toMatchObject({ status: 'completed', fingerprint: 'fp:old' });
    if (result.status !== 'completed') throw new Error('expected completed');
    expect(result.response.status).toBe(201);
    expect(result.response.headers).toEqual(headers);
    expect(Buffer.from(result.response.body).equals(body)).toBe(true);

    const record = await store.get(k('done'));
    expect(record).toMatchObject({ state: 'completed', fingerprint: 'fp:old', token });
    expect(Buffer.from(record?.response?.body ?? []).equals(body)).toBe(true);
    // Read, never rewritten: the old servers still read it too.
    expect(await old.type(prefix + k('done'))).toBe('hash');
  });

  test('an in-progress record of the hash layout holds the key, and its fingerprint is seen', async () => {
    const token = await oldServer.acquire(k('busy'), 'fp:busy', 20_000);
    const result = await store.acquire(k('busy'), { fingerprint: 'fp:other', lockTimeoutMs: 30_000 });
    expect(result).toMatchObject({ status: 'in_progress', fingerprint: 'fp:busy' });
    if (result.status !== 'in_progress') throw new Error('expected in progress');
    expect(result.retryAfterMs).toBeGreaterThan(0);
    expect(result.retryAfterMs).toBeLessThanOrEqual(20_000);
    expect(await store.get(k('busy'))).toMatchObject({ state: 'in_progress', fingerprint: 'fp:busy', token });

    // Nobody but the old owner can end it: another token is fenced off, without an error.
    const stranger = randomUUID();
    expect(await store.complete(k('busy'), stranger, { status: 200, headers: {}, body }, 60_000)).toBe(false);
    expect(await store.release(k('busy'), stranger)).toBe(false);
    expect(await store.renew(k('busy'), stranger, 30_000)).toBe(false);
    expect(await old.type(prefix + k('busy'))).toBe('hash');

    // The old owner releases it: the key is free for the new version.
    await oldServer.release(k('busy'), token);
    const again = await store.acquire(k('busy'), { fingerprint: 'fp:new', lockTimeoutMs: 30_000 });
    expect(again.status).toBe('acquired');
    expect(await old.type(prefix + k('busy'))).toBe('string');
  });

  test('a waiter on a hash-layout record wakes when the old server completes it', async () => {
    const token = await oldServer.acquire(k('wait'), 'fp:wait');
    const started = Date.now();
    const woken = store.waitFor(k('wait'), 20_000).then(() => Date.now() - started);
    // The waiter marks the record first (the old version publishes only for marked records).
    await new Promise((resolve) => setTimeout(resolve, 300));
    await oldServer.complete(k('wait'), token, 200, {}, body);
    // Woken by the PUBLISH, long before its 20 s timeout.
    expect(await woken).toBeLessThan(10_000);
    expect((await store.acquire(k('wait'), { fingerprint: 'x', lockTimeoutMs: 30_000 })).status).toBe(
      'completed',
    );
  });

  test('putCompleted replaces a hash-layout lease but not a hash-layout completion', async () => {
    await oldServer.acquire(k('copy-busy'), 'fp:a');
    const response = { status: 200, headers: {}, body };
    expect(await store.putCompleted(k('copy-busy'), { fingerprint: 'fp:a', response }, 60_000)).toBe(true);
    expect(await store.acquire(k('copy-busy'), { fingerprint: 'fp:a', lockTimeoutMs: 30_000 })).toMatchObject(
      {
        status: 'completed',
        fingerprint: 'fp:a',
      },
    );

    const token = await oldServer.acquire(k('copy-done'), 'fp:b');
    await oldServer.complete(k('copy-done'), token, 202, {}, body);
    expect(await store.putCompleted(k('copy-done'), { fingerprint: 'fp:b', response }, 60_000)).toBe(false);
    expect(await old.type(prefix + k('copy-done'))).toBe('hash');
  });
});

test('the old version cannot read a record of the string layout: its scripts fail (a store error), never run twice', async () => {
  const connected = await CLIENT_KINDS[0]?.standalone(url);
  if (connected === undefined) throw new Error('no client');
  const store = new RedisStore({ client: connected.client, prefix });
  try {
    const acquired = await store.acquire('new-record', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    expect(acquired.status).toBe('acquired');
    await expect(oldServer.acquire('new-record', 'fp')).rejects.toThrow(/WRONGTYPE/);
  } finally {
    await store.close();
    await connected.close();
  }
});

// The version before 2026-11-25 wrote the same string layout with other scripts (fixtures/string-layout-v2.ts):
// acquire by script, the token a bare UUID, complete joining the record in Lua. The two run side by side during a
// rolling deploy, each reading what the other writes.
describe.each(CLIENT_KINDS)('beside the version before 2026-11-25, on $name', (kind) => {
  let connected: ConnectedClient;
  let store: RedisStore;
  const k = (name: string) => `v2-${kind.name.replace(/\W/g, '')}-${name}`;
  const previous = {
    async acquire(key: string, fingerprint: string, lockTimeoutMs = 30_000): Promise<unknown> {
      return old.callBuffer('EVAL', V2_ACQUIRE, 1, prefix + key, fingerprint, lockTimeoutMs, randomUUID());
    },
    async complete(key: string, token: string, status: number, body: Buffer): Promise<unknown> {
      const headersJson = JSON.stringify(headers);
      const head = `${status}:${Buffer.byteLength(headersJson)}:${headersJson}`;
      return old.eval(V2_COMPLETE, 1, prefix + key, token, head, body, 86_400_000, channel);
    },
  };

  beforeAll(async () => {
    connected = await kind.standalone(url);
    store = new RedisStore({ client: connected.client, prefix });
  });
  afterAll(async () => {
    await store.close();
    await connected.close();
  });

  test("each replays the other's completed records", async () => {
    // Completed by the previous version, replayed by this one.
    const token = randomUUID();
    await old.eval(V2_ACQUIRE, 1, prefix + k('theirs'), 'fp:old', 30_000, token);
    expect(await previous.complete(k('theirs'), token, 201, body)).toBe(1);
    const replay = await store.acquire(k('theirs'), { fingerprint: 'fp:old', lockTimeoutMs: 30_000 });
    expect(replay).toMatchObject({
      status: 'completed',
      fingerprint: 'fp:old',
      response: { status: 201, headers },
    });
    expect(Buffer.from((replay as { response: { body: Uint8Array } }).response.body).equals(body)).toBe(true);

    // Completed by this one, replayed by the previous version: its acquire returns the record as it is.
    const acquired = await store.acquire(k('ours'), { fingerprint: 'fp:new', lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    expect(await store.complete(k('ours'), acquired.token, { status: 202, headers, body }, 86_400_000)).toBe(
      true,
    );
    const theirs = await previous.acquire(k('ours'), 'fp:new');
    expect(Buffer.isBuffer(theirs)).toBe(true);
    expect(parseAcquire(theirs, 'unused')).toMatchObject({
      status: 'completed',
      fingerprint: 'fp:new',
      response: { status: 202, headers },
    });
  });

  test("each one's lease holds the key for the other, with its fingerprint, and fences the other's tokens", async () => {
    // The previous version's lease: in progress here, with its remaining time; only its owner completes it.
    const token = randomUUID();
    await old.eval(V2_ACQUIRE, 1, prefix + k('their-lease'), 'fp:old', 20_000, token);
    const held = await store.acquire(k('their-lease'), { fingerprint: 'fp:new', lockTimeoutMs: 30_000 });
    expect(held).toMatchObject({ status: 'in_progress', fingerprint: 'fp:old' });
    expect((held as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(10_000);
    expect(
      await store.complete(k('their-lease'), `${token}fp:new`, { status: 200, headers, body }, 60_000),
    ).toBe(false);
    expect(await previous.complete(k('their-lease'), token, 201, body)).toBe(1);
    expect(
      (await store.acquire(k('their-lease'), { fingerprint: 'fp:old', lockTimeoutMs: 30_000 })).status,
    ).toBe('completed');

    // This version's lease: in progress for the previous version, whose token (a bare UUID) cannot complete it.
    const acquired = await store.acquire(k('our-lease'), { fingerprint: 'fp:new', lockTimeoutMs: 20_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    const theirs = await previous.acquire(k('our-lease'), 'fp:other');
    expect(parseAcquire(theirs, 'unused')).toMatchObject({ status: 'in_progress', fingerprint: 'fp:new' });
    expect(await previous.complete(k('our-lease'), randomUUID(), 201, body)).toBe(0);
    expect(await store.complete(k('our-lease'), acquired.token, { status: 200, headers, body }, 60_000)).toBe(
      true,
    );
  });
});
