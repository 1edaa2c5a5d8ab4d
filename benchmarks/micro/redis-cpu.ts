// Redis's own CPU per store operation, for RedisStore as it is (`store`: acquire by `SET ... NX GET`, complete by a
// script that checks the token and writes the record the store built), as it was before 2026-11-24 (`hash`: the
// hash layout) and the floor (src/floor.ts: its reserve-or-read script, then a plain SET PX of the
// response): a private redis-server (so no other client's commands count), the commands each sends, over one
// ioredis client with auto-pipelining (one write per event-loop turn for all), 32 in flight, 20,000 operations per phase,
// the redis-server process's CPU time (user + system, /proc) read around each phase; 5 rounds, alternating.
// `node --conditions=@oncely/source --import tsx micro/redis-cpu.ts` in benchmarks/.
import { randomUUID } from 'node:crypto';
import { startRedis } from '@oncely/testing';
import Redis from 'ioredis';
import { completedRecord } from '../../packages/redis/src/replies';
import { SCRIPTS } from '../../packages/redis/src/scripts';
import { LEGACY_ACQUIRE, LEGACY_COMPLETE } from '../../packages/redis/test/fixtures/hash-layout';
import { cpuSeconds } from '../src/cpu';
import { RESERVE } from '../src/floor';

const OPERATIONS = 20_000;
const IN_FLIGHT = 32;
const ROUNDS = Number(process.env.ROUNDS ?? 5);

const redis = await startRedis();
const client = new Redis(redis.url, { enableAutoPipelining: true });
const pid = Number(/process_id:(\d+)/.exec(await client.info('server'))?.[1]);

const body = Buffer.from(
  JSON.stringify({ id: 'ch_3MmlLrLkdIwHu7ix0snN0B15', object: 'charge', amount: 1999, status: 'succeeded' }),
);
const headers = { 'content-type': 'application/json; charset=utf-8', 'content-length': String(body.length) };
const fingerprint = 'x'.repeat(43);
const ttl = 86_400_000;

const load = async (lua: string) => (await client.script('LOAD', lua)) as string;
const hash = { acquire: await load(LEGACY_ACQUIRE), complete: await load(LEGACY_COMPLETE) };
const complete = await load(SCRIPTS.complete.lua);
const floorReserve = await load(RESERVE);

// One first execution (acquire + complete), in each layout, with the arguments its RedisStore sends.
const first = {
  hash: async (key: string) => {
    const token = randomUUID();
    await client.evalsha(hash.acquire, 1, `h:${key}`, fingerprint, 30_000, token);
    const args = [token, 201, JSON.stringify(headers), body, ttl, 'h:completed'];
    await client.evalsha(hash.complete, 1, `h:${key}`, ...args);
  },
  store: async (key: string) => {
    const token = randomUUID() + fingerprint;
    await client.setBuffer(`s:${key}`, `p${token}`, 'PX', 30_000, 'NX', 'GET');
    const record = completedRecord(fingerprint, { status: 201, headers, body }, body);
    await client.evalsha(complete, 1, `s:${key}`, token, record, ttl, 's:completed');
  },
  floor: async (key: string) => {
    await client.evalsha(floorReserve, 1, `f:${key}`, 'p', 30_000);
    const head = Buffer.from(`201\n${JSON.stringify(headers)}\n`);
    await client.set(`f:${key}`, Buffer.concat([head, body]), 'PX', ttl);
  },
};
const replay = {
  hash: (key: string) => client.evalsha(hash.acquire, 1, `h:${key}`, fingerprint, 30_000, randomUUID()),
  store: (key: string) =>
    client.setBuffer(`s:${key}`, `p${randomUUID()}${fingerprint}`, 'PX', 30_000, 'NX', 'GET'),
  floor: (key: string) => client.evalsha(floorReserve, 1, `f:${key}`, 'p', 30_000),
};
for (let i = 0; i < 100; i++) {
  await first.hash(`warm${i}`);
  await first.floor(`warm${i}`);
  await first.store(`warm${i}`);
}

let n = 0;
async function phase(operation: (key: string) => Promise<unknown>, keyOf: (i: number) => string) {
  const before = cpuSeconds(pid) ?? 0;
  let i = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (i < OPERATIONS) await operation(keyOf(i++));
    }),
  );
  return (((cpuSeconds(pid) ?? 0) - before) * 1e6) / OPERATIONS;
}

const results: Record<string, number[]> = {};
for (let round = 0; round < ROUNDS; round++) {
  const layouts = ['hash', 'store', 'floor'] as const;
  // Rotated every round, so no layout always follows the same one.
  for (const layout of layouts.map(
    (_, i) => layouts[(i + round) % layouts.length] as (typeof layouts)[number],
  )) {
    const firstUs = await phase(first[layout], () => `k${n++}`);
    const replayUs = await phase(replay[layout], (i) => `warm${i % 100}`);
    results[`${layout} first`] = [...(results[`${layout} first`] ?? []), firstUs];
    results[`${layout} replay`] = [...(results[`${layout} replay`] ?? []), replayUs];
  }
}
console.log(`Redis CPU µs per operation (median of ${ROUNDS} rounds; all rounds)`);
for (const [name, values] of Object.entries(results).sort()) {
  const sorted = [...values].sort((a, b) => a - b);
  console.log(
    `${name.padEnd(14)} ${(sorted[sorted.length >> 1] as number).toFixed(1).padStart(5)}   ${values.map((v) => v.toFixed(1)).join(' ')}`,
  );
}
client.disconnect();
await redis.stop();
process.exit(0);
