/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { IdempotencyOptionsError } from '@oncely/core';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import { createClient } from 'redis';
import { type NodeRedisClient, RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// The machine's shared Redis: every test file uses its own random prefix and never flushes.
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;

for (const kind of CLIENT_KINDS) {
  let connected: ConnectedClient;
  storeContractSuite(`RedisStore on ${kind.name}`, {
    create: async () => {
      connected = await kind.standalone(url);
      return new RedisStore({ client: connected.client, prefix });
    },
    destroy: async (store) => {
      await store.close?.();
      await connected.close();
    },
  });
}

afterAll(async () => {
  const cleaner = new Redis(url);
  const keys = await cleaner.keys(`${prefix}*`);
  if (keys.length > 0) await cleaner.del(...keys);
  await cleaner.quit();
});

describe('the client is detected, and anything else is refused with the fix', () => {
  test('a node-redis 4 client (no per-command type mapping) is named and refused', () => {
    const v4Like = { sendCommand: async () => null, duplicate: () => null, isOpen: true };
    expect(() => new RedisStore({ client: v4Like as unknown as NodeRedisClient })).toThrow(
      /node-redis 4 client.*5 and 6/,
    );
  });

  test('an object that is no Redis client is refused, naming both libraries', () => {
    expect(() => new RedisStore({ client: {} as unknown as NodeRedisClient })).toThrow(
      /ioredis Redis or Cluster.*node-redis client or cluster/,
    );
  });

  test('a node-redis client that is not connected: each operation fails (a store error), nothing hangs', async () => {
    const client = createClient({ url });
    const store = new RedisStore({ client });
    await expect(store.acquire('never', { fingerprint: 'f', lockTimeoutMs: 1000 })).rejects.toThrow(
      /closed/i,
    );
    await store.close();
  });
});

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))(
  'the Redis key on a standalone server, through %s',
  (_name, kind) => {
    const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };

    test.each([
      ['an unbraced key', 'user-1 k1'],
      ['a braced key', '{one}k2'],
      ['a scope holding a brace', 'tenant:{acme} k3'],
      ['a lone closing brace', 'user} k4'],
    ])('%s is stored as prefix + key: no digest tag where there are no slots', async (_what, key) => {
      const connected = await kind.standalone(url);
      const raw = new Redis(url);
      const layout = `${prefix}layout:${randomUUID()}:`;
      try {
        const store = new RedisStore({ client: connected.client, prefix: layout });
        expect((await store.acquire(key, lock)).status).toBe('acquired');
        expect(await raw.keys(`${layout}*`)).toEqual([layout + key]);
        await store.close();
      } finally {
        await raw.quit();
        await connected.close();
      }
    });
  },
);

test.each(['app{}:', '{}', 'a{}{b}:'])(
  'a prefix with an empty hash tag (%p) is refused, naming "prefix"',
  (bad) => {
    const client = new Redis(url, { lazyConnect: true });
    expect(() => new RedisStore({ client, prefix: bad })).toThrow(/option "prefix".*empty hash tag/);
    expect(() => new RedisStore({ client, prefix: bad })).toThrow(
      expect.objectContaining({ option: 'prefix' }),
    );
    expect(() => new RedisStore({ client, prefix: bad })).toThrow(IdempotencyOptionsError);
    client.disconnect();
  },
);

describe('RedisStore coalesceWrites', () => {
  const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };

  /** Counts the socket writes (system calls) made for `count` acquires issued in one event-loop turn. */
  async function writesFor(count: number, coalesceWrites: boolean | undefined): Promise<number> {
    const redis = new Redis(url, { maxRetriesPerRequest: 1 });
    await redis.ping();
    const store = new RedisStore({
      client: redis,
      prefix: `${prefix}coalesce:`,
      ...(coalesceWrites === undefined ? {} : { coalesceWrites }),
    });
    // Warm the script cache, so that no NOSCRIPT retry adds writes.
    await store.acquire(`warm-${randomUUID()}`, lock);
    type Writable = { _write: (...a: unknown[]) => void; _writev?: (...a: unknown[]) => void };
    const socket = (redis as unknown as { stream: Writable }).stream;
    let writes = 0;
    const write = socket._write.bind(socket);
    socket._write = (...a: unknown[]) => {
      writes++;
      write(...a);
    };
    if (socket._writev !== undefined) {
      const writev = socket._writev.bind(socket);
      socket._writev = (...a: unknown[]) => {
        writes++;
        writev(...a);
      };
    }
    const results = await Promise.all(
      Array.from({ length: count }, () => store.acquire(`k-${randomUUID()}`, lock)),
    );
    expect(results.every((r) => r.status === 'acquired')).toBe(true);
    const counted = writes;
    await store.close();
    await redis.quit();
    return counted;
  }

  test('the commands of one event-loop turn leave in one write', async () => {
    expect(await writesFor(20, undefined)).toBe(1);
  });

  test('coalesceWrites: false writes each command on its own', async () => {
    expect(await writesFor(20, false)).toBe(20);
  });

  test('the option is checked', () => {
    const redis = new Redis(url, { lazyConnect: true });
    expect(() => new RedisStore({ client: redis, coalesceWrites: 'yes' as unknown as boolean })).toThrow(
      /coalesceWrites/,
    );
    redis.disconnect();
  });
});
