// RedisStore on a 3-master Redis Cluster (private redis-servers, as the tests start them) through an ioredis
// Cluster client, with `coalesceWrites` on (each node's connection corked for the event-loop turn) and off: first
// executions (acquire + complete, new keys), 32 in flight, 10,000 per phase, 5 rounds alternating. Reports the
// operations per second, this process's CPU per operation and the three redis-servers' CPU per operation (/proc).
// `node --conditions=@oncely/source --import tsx micro/redis-cluster.ts` in benchmarks/.
import { RedisStore } from '@oncely/redis';
import { startRedisCluster } from '@oncely/testing';
import Redis, { Cluster } from 'ioredis';
import { cpuSeconds } from '../src/cpu';

const OPERATIONS = 10_000;
const IN_FLIGHT = 32;
const ROUNDS = 5;

const cluster = await startRedisCluster(3);
const pids: number[] = [];
for (const node of cluster.nodes) {
  const client = new Redis(node.port, node.host);
  pids.push(Number(/process_id:(\d+)/.exec(await client.info('server'))?.[1]));
  client.disconnect();
}
const serversCpu = () => pids.reduce((sum, pid) => sum + (cpuSeconds(pid) ?? 0), 0);

const body = Buffer.from(
  JSON.stringify({ id: 'ch_3MmlLrLkdIwHu7ix0snN0B15', object: 'charge', amount: 1999 }),
);
const response = { status: 201, headers: { 'content-type': 'application/json' }, body };
const lock = { fingerprint: 'x'.repeat(43), lockTimeoutMs: 30_000 };

const client = new Cluster(cluster.nodes);
const stores = {
  on: new RedisStore({ client, prefix: 'on:', coalesceWrites: true }),
  off: new RedisStore({ client, prefix: 'off:', coalesceWrites: false }),
};
let n = 0;
async function firstExecution(store: RedisStore): Promise<void> {
  const key = `k${n++}`;
  const acquired = await store.acquire(key, lock);
  if (acquired.status !== 'acquired') throw new Error(`${key}: ${acquired.status}`);
  await store.complete(key, acquired.token, response, 86_400_000);
}
async function phase(store: RedisStore) {
  const startedAt = performance.now();
  const ownBefore = process.cpuUsage();
  const serversBefore = serversCpu();
  let i = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (i++ < OPERATIONS) await firstExecution(store);
    }),
  );
  const own = process.cpuUsage(ownBefore);
  return {
    perSecond: OPERATIONS / ((performance.now() - startedAt) / 1000),
    clientUs: (own.user + own.system) / OPERATIONS,
    serversUs: ((serversCpu() - serversBefore) * 1e6) / OPERATIONS,
  };
}

for (let i = 0; i < 2_000; i++) await firstExecution(i % 2 === 0 ? stores.on : stores.off); // warm-up
const results: Record<'on' | 'off', { perSecond: number; clientUs: number; serversUs: number }[]> = {
  on: [],
  off: [],
};
for (let round = 0; round < ROUNDS; round++) {
  for (const name of round % 2 === 0 ? (['on', 'off'] as const) : (['off', 'on'] as const))
    results[name].push(await phase(stores[name]));
}
const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1] as number;
console.log(`3-master Cluster, first executions, median of ${ROUNDS} rounds`);
for (const name of ['on', 'off'] as const) {
  const r = results[name];
  console.log(
    `coalesceWrites ${name.padEnd(3)}  ${Math.round(median(r.map((x) => x.perSecond)))}/s  client CPU ${median(r.map((x) => x.clientUs)).toFixed(1)} µs  Redis CPU (3 servers) ${median(r.map((x) => x.serversUs)).toFixed(1)} µs per first execution`,
  );
}
await client.quit();
await cluster.stop();
process.exit(0);
