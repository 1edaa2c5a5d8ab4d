/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import { RedisStore } from '../src';

// The machine's shared Redis: every test file uses its own random prefix and never flushes.
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;
let client: Redis;

storeContractSuite('RedisStore', {
  create: () => {
    client = new Redis(url, { lazyConnect: false, maxRetriesPerRequest: 1 });
    return new RedisStore({ client, prefix });
  },
  destroy: async (store) => {
    await store.close?.();
    const keys = await client.keys(`${prefix}*`);
    if (keys.length > 0) await client.del(...keys);
    await client.quit();
  },
});

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
