/**
 * @services redis-server
 */
import { type PrivateRedis, startRedis } from '@oncely/testing';
import Redis from 'ioredis';
import { RedisStore } from '../src';
import { SCRIPTS } from '../src/scripts';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { commandsDuring } from './monitor';

// acquire's fast path: `SET key record PX lockTimeout NX GET` reserves a free key or reads a completed record
// without a script; a live lease, a hash-layout record or a refused SET go to the acquire script. On a private
// redis-server: one test fills its memory, and every test counts the commands it sees.

let redis: PrivateRedis;
let inspect: Redis;

beforeAll(async () => {
  redis = await startRedis();
  inspect = new Redis(redis.url);
  // Loaded up front, so each command list below is the store's own (not a first call's NOSCRIPT and EVAL).
  for (const script of Object.values(SCRIPTS)) await inspect.script('LOAD', script.lua);
});
afterAll(async () => {
  inspect.disconnect();
  await redis.stop();
});

/** How many times Redis refused a command before running it (OOM, ...): MONITOR does not show those. */
async function rejectedCalls(command: string): Promise<number> {
  const stats = await inspect.info('commandstats');
  return Number(new RegExp(`cmdstat_${command}:.*rejected_calls=(\\d+)`).exec(stats)?.[1] ?? 0);
}

const done = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('made') };

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('acquire on %s', (name, kind) => {
  let connected: ConnectedClient;
  let store: RedisStore;
  const prefix = `${name.replace(' ', '-')}:`;

  beforeAll(async () => {
    connected = await kind.standalone(redis.url);
    store = new RedisStore({ client: connected.client, prefix });
  });
  afterAll(async () => {
    await store.close();
    await connected.close();
  });

  test('the reservation writes the in-progress record of the layout (state, UUID, fingerprint), leased by the key expiry', async () => {
    const fingerprint = 'sha256:ü€-fingerprint';
    const acquired = await store.acquire('layout', { fingerprint, lockTimeoutMs: 7_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    // The token is the UUID and the fingerprint; the record, 'p' and the token: what every version's scripts read.
    expect(acquired.token).toMatch(
      /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}sha256:ü€-fingerprint$/,
    );
    const stored = await inspect.getBuffer(`${prefix}layout`);
    expect(stored?.equals(Buffer.from(`p${acquired.token}`))).toBe(true);
    expect(await store.get('layout')).toMatchObject({
      state: 'in_progress',
      fingerprint,
      token: acquired.token,
    });
    const pttl = await inspect.pttl(`${prefix}layout`);
    expect(pttl).toBeGreaterThan(5_000);
    expect(pttl).toBeLessThanOrEqual(7_000);
    // Fencing reads it as the script's own record: a stranger's token is refused, the owner's completes.
    expect(await store.complete('layout', 'x'.repeat(36), done, 60_000)).toBe(false);
    expect(await store.complete('layout', acquired.token, done, 60_000)).toBe(true);
  });

  test('a key under a live lease goes to the acquire script, which reports the lease: in progress, with its remaining time', async () => {
    const first = await store.acquire('held', { fingerprint: 'f1', lockTimeoutMs: 5_000 });
    expect(first.status).toBe('acquired');
    let second: Awaited<ReturnType<RedisStore['acquire']>> | undefined;
    const commands = await commandsDuring(redis.url, async () => {
      second = await store.acquire('held', { fingerprint: 'f2', lockTimeoutMs: 5_000 });
    });
    expect(commands).toEqual(['set', 'evalsha']);
    expect(second).toMatchObject({ status: 'in_progress', fingerprint: 'f1' });
    const retryAfterMs = (second as { retryAfterMs: number }).retryAfterMs;
    expect(retryAfterMs).toBeGreaterThan(3_000);
    expect(retryAfterMs).toBeLessThanOrEqual(5_000);
    // The failed SET left the lease as it was.
    expect(await inspect.get(`${prefix}held`)).toMatch(/^p.{36}f1$/);
  });

  test('a completed record is answered by the SET alone, and the SET leaves it and its expiry untouched', async () => {
    const acquired = await store.acquire('replayed', { fingerprint: 'f', lockTimeoutMs: 5_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    await store.complete('replayed', acquired.token, done, 3_600_000);
    const before = await inspect.getBuffer(`${prefix}replayed`);
    let replay: Awaited<ReturnType<RedisStore['acquire']>> | undefined;
    const commands = await commandsDuring(redis.url, async () => {
      replay = await store.acquire('replayed', { fingerprint: 'f', lockTimeoutMs: 5_000 });
    });
    expect(commands).toEqual(['set']);
    expect(replay).toMatchObject({ status: 'completed', fingerprint: 'f', response: { status: 201 } });
    expect(Buffer.from((replay as { response: { body: Uint8Array } }).response.body).toString()).toBe('made');
    expect((await inspect.getBuffer(`${prefix}replayed`))?.equals(before as Buffer)).toBe(true);
    expect(await inspect.pttl(`${prefix}replayed`)).toBeGreaterThan(3_500_000);
  });

  test('while Redis refuses writes (maxmemory reached, noeviction), a replay is still answered (by the script, which only reads) and a new key fails as a store error', async () => {
    const acquired = await store.acquire('before-oom', { fingerprint: 'f', lockTimeoutMs: 5_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    await store.complete('before-oom', acquired.token, done, 3_600_000);
    await inspect.config('SET', 'maxmemory-policy', 'noeviction');
    await inspect.config('SET', 'maxmemory', '1');
    try {
      let replay: Awaited<ReturnType<RedisStore['acquire']>> | undefined;
      const refusedBefore = await rejectedCalls('set');
      const commands = await commandsDuring(redis.url, async () => {
        replay = await store.acquire('before-oom', { fingerprint: 'f', lockTimeoutMs: 5_000 });
      });
      // The SET was refused (counted, not MONITORed), then the script ran.
      expect(await rejectedCalls('set')).toBe(refusedBefore + 1);
      expect(commands).toEqual(['evalsha']);
      expect(replay).toMatchObject({ status: 'completed', response: { status: 201 } });
      await expect(store.acquire('during-oom', { fingerprint: 'f', lockTimeoutMs: 5_000 })).rejects.toThrow(
        /OOM/,
      );
    } finally {
      await inspect.config('SET', 'maxmemory', '0');
    }
    expect(await inspect.exists(`${prefix}during-oom`)).toBe(0);
    // Writes work again: the store did not give up its fast path over an OOM.
    const commands = await commandsDuring(redis.url, () =>
      store.acquire('after-oom', { fingerprint: 'f', lockTimeoutMs: 5_000 }),
    );
    expect(commands).toEqual(['set']);
  });
});

test('a server that refuses SET ... NX GET as a syntax error (Redis before 7.0) gets the acquire script, from then on without the SET', async () => {
  // Redis 7.0 is what this machine has; the refusal of an older server is made real by an option Redis rejects
  // beside PX (KEEPTTL), so the reply is the server's own "ERR syntax error".
  const client = new Redis(redis.url);
  const setBuffer = client.setBuffer.bind(client) as (...args: unknown[]) => Promise<unknown>;
  let sets = 0;
  Object.assign(client, {
    setBuffer: (...args: unknown[]) => {
      sets++;
      return setBuffer(...args, 'KEEPTTL');
    },
  });
  const store = new RedisStore({ client, prefix: 'old-server:' });
  try {
    const first = await store.acquire('a', { fingerprint: 'f', lockTimeoutMs: 5_000 });
    expect(first.status).toBe('acquired');
    expect(sets).toBe(1);
    if (first.status !== 'acquired') return;
    await store.complete('a', first.token, done, 60_000);
    const commands = await commandsDuring(redis.url, async () => {
      expect((await store.acquire('a', { fingerprint: 'f', lockTimeoutMs: 5_000 })).status).toBe('completed');
      expect((await store.acquire('b', { fingerprint: 'f', lockTimeoutMs: 5_000 })).status).toBe('acquired');
      expect((await store.acquire('b', { fingerprint: 'f', lockTimeoutMs: 5_000 })).status).toBe(
        'in_progress',
      );
    });
    expect(commands).toEqual(['evalsha', 'evalsha', 'evalsha']);
    expect(sets).toBe(1);
  } finally {
    await store.close();
    client.disconnect();
  }
});
