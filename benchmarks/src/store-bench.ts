// Store micro-benchmark, one store per process: acquire+complete and replay (acquire on a completed key)
// operations per second with a fixed number in flight, then round trips per operation, counted: Redis commands
// seen by MONITOR (script-internal commands excluded), PostgreSQL queries through a wrapped pool.query, MySQL
// statements through a wrapped pool.execute and pool.query, DynamoDB commands through a wrapped client.send. Prints one JSON line.
import type { IdempotencyStore, StoredResponse } from '@oncely/core';
import pg from 'pg';
import { readConfig } from './config';
import { startMonitor } from './monitor';
import type { StoreBenchConfig, StoreBenchResult } from './store-bench-types';
import { openStore } from './stores';

const config = readConfig<StoreBenchConfig>();
const { store: name, services, duration, concurrency, countOps, keyPrefix } = config;

const response: StoredResponse = {
  status: 201,
  headers: { 'content-type': 'application/json; charset=utf-8', 'content-length': '103' },
  body: Buffer.alloc(103, 0x61),
};
const FINGERPRINT = 'k2Z1oMIFbvm4SRjWw0nQmOB3gMuGmmqcA1uN8bgXQ5k';
const LOCK = 30_000;
const TTL = 86_400_000;

const opened = await openStore(name, services);
const store: IdempotencyStore = opened.store;

let serial = 0;
async function acquireComplete(): Promise<void> {
  const key = `${keyPrefix}${serial++}`;
  const acquired = await store.acquire(key, { fingerprint: FINGERPRINT, lockTimeoutMs: LOCK });
  if (acquired.status !== 'acquired') throw new Error(`acquire on a new key: ${acquired.status}`);
  if (!(await store.complete(key, acquired.token, response, TTL))) throw new Error('complete refused');
}

const warm = Array.from({ length: 100 }, (_, i) => `${keyPrefix}warm-${i}`);
let replays = 0;
async function replay(): Promise<void> {
  const key = warm[replays++ % warm.length] as string;
  const result = await store.acquire(key, { fingerprint: FINGERPRINT, lockTimeoutMs: LOCK });
  if (result.status !== 'completed') throw new Error(`acquire on a completed key: ${result.status}`);
}

/** Runs `op` with `concurrency` in flight for `seconds`; operations per second. */
async function throughput(op: () => Promise<void>, seconds: number): Promise<number> {
  const deadline = performance.now() + seconds * 1000;
  let done = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < deadline) {
        await op();
        done++;
      }
    }),
  );
  return done / ((performance.now() - start) / 1000);
}

// Counting: one wrapper per store kind, reset before each counted phase.
let count = 0;
// Redis counts in the monitor; the others in `count`.
let readCount = () => count;
let counter = 'none (in-process)';
let stopCounting: () => Promise<void> = async () => {};
if (name === 'redis' || name === 'redis-node') {
  counter = 'Redis MONITOR';
  const monitor = await startMonitor(services.redisUrl, keyPrefix);
  readCount = () => monitor.count;
  stopCounting = async () => {
    monitor.stop();
  };
} else if (opened.countCalls !== undefined) {
  counter =
    name === 'postgres'
      ? 'pool.query wrapper'
      : name === 'mysql'
        ? 'pool.execute/query wrapper'
        : 'client.send wrapper';
  opened.countCalls(() => {
    count++;
  });
}

// (Re)completes the warm keys: MemoryStore's LRU (10,000 records by default) evicts them during a phase of new
// keys, so each replay phase starts by putting them back.
async function warmKeys(): Promise<void> {
  for (const key of warm) {
    const acquired = await store.acquire(key, { fingerprint: FINGERPRINT, lockTimeoutMs: LOCK });
    if (acquired.status === 'acquired') await store.complete(key, acquired.token, response, TTL);
  }
}

// Warm-up, then the two measured phases.
await throughput(acquireComplete, Math.min(1, duration));
await warmKeys();
await throughput(replay, Math.min(0.5, duration));
const acquireCompleteOps = await throughput(acquireComplete, duration);
await warmKeys();
const replayOps = await throughput(replay, duration);

// Counted phases: one operation at a time, so nothing else is in flight.
const countPhase = async (op: () => Promise<void>): Promise<number | null> => {
  if (name === 'memory' || counter === 'unavailable') return null;
  await new Promise((resolve) => setTimeout(resolve, 100));
  const before = readCount();
  for (let i = 0; i < countOps; i++) await op();
  await new Promise((resolve) => setTimeout(resolve, 300)); // MONITOR lines arrive after the replies
  return (readCount() - before) / countOps;
};
// PostgreSQL: WAL written per operation, over the counted phases (another client writing meanwhile would add to
// it). A replay that writes WAL is a write transaction: it waits for its commit to be flushed.
const walPool = name === 'postgres' ? new pg.Pool({ connectionString: services.pgUrl, max: 1 }) : undefined;
const lsn = async () =>
  (await walPool?.query<{ lsn: string }>('SELECT pg_current_wal_insert_lsn()::text AS lsn'))?.rows[0]?.lsn;
const walSince = async (from: string | undefined) =>
  from === undefined || walPool === undefined
    ? undefined
    : Number(
        (
          await walPool.query<{ d: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1) AS d', [
            from,
          ])
        ).rows[0]?.d,
      ) / countOps;

let wal = await lsn();
const tripsFirst = await countPhase(acquireComplete);
const walFirst = await walSince(wal);
await warmKeys();
wal = await lsn();
const tripsReplay = await countPhase(replay);
const walReplay = await walSince(wal);
await walPool?.end();
await stopCounting();
await opened.close();

const result: StoreBenchResult = {
  store: name,
  acquireComplete: acquireCompleteOps,
  replay: replayOps,
  tripsFirst,
  tripsReplay,
  counter,
  ...(walFirst === undefined ? {} : { walBytesFirst: walFirst }),
  ...(walReplay === undefined ? {} : { walBytesReplay: walReplay }),
};
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exit(0);
