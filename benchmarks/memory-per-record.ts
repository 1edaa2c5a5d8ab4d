// Memory per stored record, 100-byte body, for MemoryStore (V8 heap) and RedisStore (Redis used_memory), each
// measured over 20,000 completed records with the headers a typical JSON response keeps.
// Run: pnpm --filter @oncely/benchmarks memory   (starts its own redis-server on a free port); `pnpm bench` runs it
// too and reads the JSON line it prints last. MEMORY_RECORDS overrides the number of records.
import { randomUUID } from 'node:crypto';
import { type IdempotencyStore, MemoryStore, type StoredResponse } from '@oncely/core';
import { RedisStore } from '@oncely/redis';
import { startRedis } from '@oncely/testing';
import Redis from 'ioredis';

const RECORDS = Number(process.env.MEMORY_RECORDS ?? 20_000);
const response: StoredResponse = {
  status: 201,
  headers: {
    'content-type': 'application/json; charset=utf-8',
    etag: 'W/"64-Qm9ndXNFdGFnVmFsdWVGb3JUZXN0"',
    'x-powered-by': 'Express',
  },
  body: Buffer.alloc(100, 0x61),
};

async function fill(store: IdempotencyStore): Promise<void> {
  for (let i = 0; i < RECORDS; i++) {
    // A UUID key and a base64url SHA-256 fingerprint: what a real request stores.
    const key = randomUUID();
    const fingerprint = Buffer.from(randomUUID() + randomUUID())
      .toString('base64url')
      .slice(0, 43);
    const acquired = await store.acquire(key, { fingerprint, lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error('unexpected');
    // Each record gets its own body buffer, as each real response does.
    await store.complete(key, acquired.token, { ...response, body: Buffer.from(response.body) }, 86_400_000);
  }
}

const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');

gc();
const before = process.memoryUsage();
const memory = new MemoryStore({ maxEntries: RECORDS * 2 });
await fill(memory);
gc();
const after = process.memoryUsage();
const memoryBytes = (after.heapUsed + after.arrayBuffers - before.heapUsed - before.arrayBuffers) / RECORDS;

const redis = await startRedis();
const client = new Redis(redis.url);
const usedMemory = async () => Number(/used_memory:(\d+)/.exec(await redis.cli('info', 'memory'))?.[1]);
if (process.env.LISTPACK_VALUE)
  await redis.cli('config', 'set', 'hash-max-listpack-value', process.env.LISTPACK_VALUE);
const redisBefore = await usedMemory();
await fill(new RedisStore({ client }));
const redisBytes = ((await usedMemory()) - redisBefore) / RECORDS;
const sample = (await client.keys('oncely:*'))[0] as string;
const usage = await client.memory('USAGE', sample);
const encoding = await client.object('ENCODING', sample);
await client.quit();
await redis.stop();
await memory.close();

console.log(`records: ${RECORDS}, body: 100 bytes, 3 headers, UUID keys`);
console.log(`MemoryStore: ${Math.round(memoryBytes)} bytes per record (V8 heap + buffers)`);
console.log(
  `RedisStore:  ${Math.round(redisBytes)} bytes per record (used_memory delta); MEMORY USAGE of one: ${usage}, encoding ${encoding}`,
);
console.log(
  JSON.stringify({
    records: RECORDS,
    memoryStore: Math.round(memoryBytes),
    redisStore: Math.round(redisBytes),
    redisMemoryUsage: usage,
    redisEncoding: encoding,
  }),
);
