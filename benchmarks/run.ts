// pnpm bench: the HTTP matrix (Express and Fastify × stores × scenarios, and the npm peers), the store
// micro-benchmarks, round trips counted, memory per record; --report writes docs/benchmarks.md and its chart.
// `pnpm bench --help` lists the flags. The root script builds the packages first: servers load the built dist.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { MySQLStore } from '@oncely/mysql';
import { PostgresStore } from '@oncely/postgres';
import { type PrivateRedis, startRedis } from '@oncely/testing';
import Redis from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { BENCH_DIR, lastLine, startChild } from './src/child';
import type { Framework, Services, StoreName } from './src/config';
import { mysqlProcesses, postgresProcesses, redisProcesses } from './src/cpu';
import { type DynamoSetup, setupDynamo } from './src/dynamo-setup';
import {
  buildMatrix,
  FRAMEWORK_LABEL,
  type HttpCase,
  type LoadOptions,
  type Measurement,
  measureCase,
  roundOrder,
  SCENARIOS,
  type Scenario,
  startServer,
} from './src/http';
import { measureLambdaColdStart } from './src/lambda';
import { describeMachine } from './src/machine';
import { startMonitor } from './src/monitor';
import { summariseProfile } from './src/profile';
import { startPrimaryWithReplica } from './src/replica';
import { renderMarkdown, renderSvg } from './src/report';
import {
  type CaseResult,
  evaluateTargets,
  type MemoryResult,
  medianOf,
  type ProfileResult,
  type RunResults,
  ratioToBare,
  type TripsResult,
} from './src/results';
import type { StoreBenchConfig, StoreBenchResult } from './src/store-bench-types';

const HELP = `pnpm bench [flags]
  --framework express,fastify,hono,koa,nest frameworks (default: all five)
  --store memory,redis,postgres,mysql  oncely stores (default: all reachable, and dynamodb when packages/dynamodb
                                  is built)
  --scenario first,replay,nokey   scenarios besides the bare framework (default: all)
  --peers / --no-peers            the npm peers on Express (default: on when memory or redis is measured)
  --otel                          also Fastify + Memory first execution with @oncely/opentelemetry on (metrics,
                                  SDK with a no-op exporter); compared with the same case without it
  --duration <s>                  measured seconds per case (default 10)
  --rounds <n>                    rounds, median reported (default 3)
  --connections <n>               autocannon connections (default 50)
  --no-micro --no-memory          skip the store micro-benchmarks / memory per record
  --no-lambda                     skip the AWS Lambda cold starts (bundle sizes and import times, oncely and
                                  Powertools; lambda-cold-start.ts runs them alone)
  --smoke                         1 s per case, 1 round, short micro-benchmarks: checks the harness, asserts no speed
  --report                        write docs/benchmarks.md and docs/benchmarks.svg; profile missed targets
  --from <results.json>           with --report: write the page from saved results instead of measuring
  --profile <case id,...>         only profile these cases (e.g. fastify/oncely-memory/first) with --cpu-prof and
                                  print the top self-time functions; the .cpuprofile files go to benchmarks/profiles/`;

const { values: args } = parseArgs({
  options: {
    framework: { type: 'string' },
    store: { type: 'string' },
    scenario: { type: 'string' },
    peers: { type: 'boolean' },
    otel: { type: 'boolean' },
    'no-peers': { type: 'boolean' },
    'no-micro': { type: 'boolean' },
    'no-memory': { type: 'boolean' },
    'no-lambda': { type: 'boolean' },
    duration: { type: 'string' },
    rounds: { type: 'string' },
    connections: { type: 'string' },
    smoke: { type: 'boolean' },
    report: { type: 'boolean' },
    from: { type: 'string' },
    profile: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  },
  strict: true,
});

if (args.help) {
  console.log(HELP);
  process.exit(0);
}

const ROOT = join(BENCH_DIR, '..');
const DOCS = join(ROOT, 'docs');
const RESULTS_DIR = join(BENCH_DIR, 'results');
const PROFILE_DIR = join(BENCH_DIR, 'profiles');
const NOTES = join(BENCH_DIR, 'notes.md');

function list<T extends string>(
  value: string | undefined,
  allowed: readonly T[],
  what: string,
): T[] | undefined {
  if (value === undefined) return undefined;
  const items = value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const item of items)
    if (!allowed.includes(item as T))
      throw new Error(`--${what}: unknown ${JSON.stringify(item)} (known: ${allowed.join(', ')})`);
  return items as T[];
}

function positive(value: string | undefined, fallback: number, what: string): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${what} must be a positive number`);
  return n;
}

function log(message: string): void {
  process.stderr.write(`${message}\n`);
}

function writeReport(results: RunResults): void {
  mkdirSync(DOCS, { recursive: true });
  const page = join(DOCS, 'benchmarks.md');
  writeFileSync(join(DOCS, 'benchmarks.svg'), renderSvg(results));
  writeFileSync(page, renderMarkdown(results, 'benchmarks.svg', NOTES));
  // The repository's formatter aligns the tables, so that `pnpm lint` passes on the page as written.
  try {
    // The workspace's own biome, not `pnpm exec`: pnpm need not be on PATH (README: Node and npm only).
    const biome = join(ROOT, 'node_modules', '.bin', process.platform === 'win32' ? 'biome.cmd' : 'biome');
    execFileSync(biome, ['format', '--write', page], { cwd: ROOT, stdio: 'ignore' });
  } catch {
    log('biome could not format docs/benchmarks.md: run `npm run format`');
  }
  log('wrote docs/benchmarks.md and docs/benchmarks.svg');
}

if (args.from !== undefined) {
  const results = JSON.parse(readFileSync(args.from, 'utf8')) as RunResults;
  writeReport(results);
  process.exit(0);
}

const smoke = args.smoke === true;
const started = Date.now();
const duration = smoke ? 1 : positive(args.duration, 10, 'duration');
const rounds = smoke ? 1 : Math.round(positive(args.rounds, 3, 'rounds'));
const connections = Math.round(positive(args.connections, 50, 'connections'));
const warmup = smoke ? 0.25 : Math.min(2, Math.max(0.5, duration / 4));
const microDuration = smoke ? 0.5 : Math.min(5, Math.max(1, duration / 2));
const microConcurrency = 32;
const countOps = smoke ? 20 : 200;
const replayKeys = 100;

const frameworks = list(
  args.framework,
  ['express', 'fastify', 'hono', 'koa', 'nest'] as const,
  'framework',
) ?? ['express', 'fastify', 'hono', 'koa', 'nest'];
const scenarios = list(args.scenario, SCENARIOS, 'scenario') ?? [...SCENARIOS];
const requestedStores = list(
  args.store,
  ['memory', 'redis', 'redis-node', 'postgres', 'mysql', 'dynamodb'] as const,
  'store',
);
const notes: string[] = [];
if (process.env.ONCELY_BENCH_REDIS_REPLICA === '1')
  notes.push(
    "Redis: a private primary with one replica (ONCELY_BENCH_REDIS_REPLICA=1); RedisStore with waitForReplicas: { replicas: 1, timeout: '1s' }.",
  );

const runId = randomBytes(4).toString('hex');
// ONCELY_BENCH_REDIS_REPLICA=1: the Redis cases run on a private primary with one replica of its own, and
// RedisStore confirms each reservation and completion on it (waitForReplicas: { replicas: 1, timeout: '1s' }).
const replicaSet =
  process.env.ONCELY_BENCH_REDIS_REPLICA === '1' ? await startPrimaryWithReplica() : undefined;
const redisUrl = replicaSet?.primary.url ?? process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const pgUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const mysqlUrl = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';
const services: Services = {
  redisUrl,
  redisReplicas: replicaSet === undefined ? undefined : 1,
  redisPrefix: `oncely-bench-${runId}:`,
  pgUrl,
  pgSchema: `bench_${runId}`,
  mysqlUrl,
  mysqlTable: `oncely_bench_${runId}`,
};

const machine = await describeMachine(redisUrl, pgUrl, mysqlUrl);
log(
  `oncely bench ${runId}: ${machine.cpu}, ${machine.cores} cores, Node ${machine.node}, Redis ${machine.redis}, PostgreSQL ${machine.postgres}, MySQL ${machine.mysql}`,
);

// Which stores: the requested ones, or every one that is reachable (DynamoDB when its package is there).
const stores: StoreName[] = [];
for (const store of requestedStores ??
  (['memory', 'redis', 'redis-node', 'postgres', 'mysql', 'dynamodb'] as const)) {
  const explicit = requestedStores !== undefined;
  if ((store === 'redis' || store === 'redis-node') && machine.redis === 'unreachable') {
    if (explicit) throw new Error(`Redis is unreachable at ${redisUrl} (set REDIS_URL)`);
    if (store === 'redis') notes.push(`Redis: unreachable at ${redisUrl}, so every Redis case was skipped.`);
    continue;
  }
  if (store === 'postgres' && machine.postgres === 'unreachable') {
    if (explicit) throw new Error(`PostgreSQL is unreachable at ${pgUrl} (set DATABASE_URL)`);
    notes.push(`PostgreSQL: unreachable at ${pgUrl}, so every PostgreSQL case was skipped.`);
    continue;
  }
  if (store === 'mysql' && machine.mysql === 'unreachable') {
    if (explicit) throw new Error(`MySQL is unreachable at ${mysqlUrl} (set MYSQL_URL)`);
    notes.push(`MySQL: unreachable at ${mysqlUrl}, so every MySQL case was skipped.`);
    continue;
  }
  stores.push(store);
}

// DynamoDB: only when @oncely/dynamodb exists and builds; on dynalite (DynamoDB's API in Node, in a child process).
let dynamo: DynamoSetup | undefined;
if (stores.includes('dynamodb')) {
  const outcome = await setupDynamo(ROOT, runId);
  if (typeof outcome === 'string') {
    if (requestedStores?.includes('dynamodb')) throw new Error(`DynamoDB: ${outcome}`);
    notes.push(`DynamoDB: ${outcome}`);
    stores.splice(stores.indexOf('dynamodb'), 1);
  } else {
    dynamo = outcome;
    services.dynamo = outcome.services;
  }
}

const peers = (args.peers ?? !args['no-peers']) && stores.some((s) => s === 'memory' || s === 'redis');

let pgPool: pg.Pool | undefined;
if (stores.includes('postgres')) {
  pgPool = new pg.Pool({ connectionString: pgUrl, max: 2 });
  await new PostgresStore({ pool: pgPool, schema: services.pgSchema }).migrate();
}

let mysqlPool: mysql.Pool | undefined;
if (stores.includes('mysql')) {
  mysqlPool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 2 });
  await new MySQLStore({ pool: mysqlPool, table: services.mysqlTable }).migrate();
}

// A private redis-server (when the binary is there) for counting commands and for memory per record.
let privateRedis: PrivateRedis | undefined;
const hasRedisServer = (() => {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

async function cleanup(): Promise<void> {
  if (machine.redis !== 'unreachable') {
    const client = new Redis(redisUrl);
    let removed = 0;
    let cursor = '0';
    do {
      const [next, keys] = await client.scan(cursor, 'MATCH', `*${runId}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) removed += await client.del(...keys);
    } while (cursor !== '0');
    await client.quit();
    log(`cleanup: ${removed} Redis keys of run ${runId} removed`);
  }
  if (pgPool !== undefined) {
    await pgPool.query(`DROP SCHEMA IF EXISTS ${services.pgSchema} CASCADE`);
    await pgPool.end();
    log(`cleanup: schema ${services.pgSchema} dropped`);
  }
  if (mysqlPool !== undefined) {
    await mysqlPool.query(`DROP TABLE IF EXISTS \`${services.mysqlTable}\``);
    await mysqlPool.end();
    log(`cleanup: table ${services.mysqlTable} dropped`);
  }
  await privateRedis?.stop();
  await replicaSet?.stop();
  await dynamo?.stop();
}

// The store servers whose CPU time per request is read beside the server's (when they run on this machine).
const storeProcesses: LoadOptions['storeProcesses'] = {};
if (stores.includes('redis') || stores.includes('redis-node') || peers) {
  const redis = await redisProcesses(redisUrl);
  if (redis === undefined)
    notes.push(`Redis CPU per request: the server at ${redisUrl} is not a process here.`);
  else storeProcesses.redis = redis;
}
if (stores.includes('postgres')) {
  const postgres = await postgresProcesses(pgUrl);
  if (postgres === undefined)
    notes.push(`PostgreSQL CPU per request: the server at ${pgUrl} is not a process here.`);
  else storeProcesses.postgres = postgres;
}

if (stores.includes('mysql')) {
  const server = await mysqlProcesses(mysqlUrl);
  if (server === undefined)
    notes.push(`MySQL CPU per request: the server at ${mysqlUrl} is not a process here.`);
  else storeProcesses.mysql = server;
}

const load: LoadOptions = { duration, warmup, connections, replayKeys, storeProcesses };
const results: RunResults = {
  date: new Date().toISOString(),
  command: `pnpm bench ${process.argv.slice(2).join(' ')}`.trim(),
  runId,
  commit: gitDescribe(),
  elapsedSec: 0,
  smoke,
  options: { duration, warmup, rounds, connections, replayKeys, microDuration, microConcurrency, countOps },
  machine,
  http: [],
  stores: [],
  httpTrips: [],
  tripsCounter: '',
  memory: null,
  lambda: null,
  profiles: [],
  notes,
};

async function stage(what: string, run: () => Promise<void>): Promise<void> {
  try {
    await run();
  } catch (error) {
    const message = String(error instanceof Error ? error.message : error).split('\n')[0];
    log(`${what}: failed: ${message}`);
    notes.push(`${what}: failed in this run (${message}).`);
    if (smoke) throw error; // the smoke run is there to catch a broken harness
  }
}

function saveResults(): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const json = `${JSON.stringify(results, null, 2)}\n`;
  writeFileSync(join(RESULTS_DIR, `${smoke ? 'smoke' : 'run'}-${runId}.json`), json);
  writeFileSync(join(RESULTS_DIR, smoke ? 'smoke.json' : 'latest.json'), json);
}

/** The commit the packages were built from, and whether packages/ had uncommitted changes. */
function gitDescribe(): string | undefined {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], {
      cwd: ROOT,
      encoding: 'utf8',
    }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'packages'], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    return dirty.trim() === '' ? head : `${head} + uncommitted changes in packages/`;
  } catch {
    return undefined;
  }
}

/**
 * The smoke run checks that each part of the harness still works, not the whole matrix (over 100 cases, some ten
 * minutes at 1 s each): every framework and peer, every store on Express, every scenario on Express + memory.
 */
function smokeCases(all: HttpCase[]): HttpCase[] {
  return all.filter((c) => {
    if (c.scenario === 'bare') return true;
    const k = c.kind;
    if (k.impl !== 'oncely') return c.scenario === 'first';
    if (k.framework === 'express' && k.store === 'memory') return true;
    return c.scenario === 'first' && (k.framework === 'express' || k.store === 'memory');
  });
}

function fmt(m: Measurement): string {
  const cpu = `  cpu ${m.cpuServerUs === undefined ? '-' : m.cpuServerUs.toFixed(1)} µs${m.cpuStoreUs === undefined ? '' : ` + store ${m.cpuStoreUs.toFixed(1)} µs`}`;
  return `${Math.round(m.rps).toString().padStart(6)} req/s  p50 ${m.p50.toFixed(2)} ms  p99 ${m.p99.toFixed(2)} ms${cpu}  non-2xx ${m.non2xx}${m.errors > 0 ? `  errors ${m.errors}` : ''}`;
}

try {
  const matrix = buildMatrix({
    frameworks: frameworks as Framework[],
    stores,
    scenarios: scenarios as Scenario[],
    peers,
    otel: args.otel === true,
  });
  const cases = smoke ? smokeCases(matrix) : matrix;
  if (args.profile !== undefined) {
    for (const id of args.profile.split(',')) {
      const c = cases.find((x) => x.id === id);
      if (c === undefined)
        throw new Error(`--profile: no case ${id} (known: ${cases.map((x) => x.id).join(', ')})`);
      printProfile(await profileCase(c));
    }
    await cleanup();
    process.exit(0);
  }
  // 1. The HTTP matrix.
  const measured = new Map<string, Measurement[]>(cases.map((c) => [c.id, []]));
  const total = cases.length * rounds;
  let done = 0;
  for (let round = 0; round < rounds; round++) {
    for (const c of roundOrder(cases, round)) {
      const m = await measureCase(c, services, load, `${runId}-${cases.indexOf(c)}-${round}-`);
      measured.get(c.id)?.push(m);
      done++;
      log(`[${String(done).padStart(3)}/${total}] round ${round + 1}  ${c.id.padEnd(42)} ${fmt(m)}`);
    }
  }
  results.http = cases.map((c): CaseResult => {
    const list = measured.get(c.id) ?? [];
    return { case: c, rounds: list, median: medianOf(list) };
  });

  saveResults();

  // 2. Round trips per HTTP request on Redis, counted with MONITOR. A later stage that fails leaves a note and
  // the measurements so far, rather than nothing.
  if (stores.includes('redis') || stores.includes('redis-node'))
    await stage('Redis round trips per HTTP request', async () => {
      // With ONCELY_BENCH_REDIS_REPLICA=1 the primary with its replica is already private (and WAIT needs the replica).
      if (hasRedisServer && replicaSet === undefined) privateRedis = await startRedis();
      const countUrl = privateRedis?.url ?? redisUrl;
      results.tripsCounter = privateRedis
        ? 'a private redis-server'
        : `the shared Redis at ${redisUrl}, filtered by key`;
      // One server of each kind that uses Redis: oncely on each framework, and the peers.
      const seen = new Set<string>();
      for (const c of cases) {
        if (!('store' in c.kind) || (c.kind.store !== 'redis' && c.kind.store !== 'redis-node')) continue;
        const subject =
          c.kind.impl === 'oncely'
            ? `oncely on ${FRAMEWORK_LABEL[c.kind.framework]}${c.kind.store === 'redis-node' ? ' (node-redis)' : ''}`
            : c.kind.impl === 'floor'
              ? `floor (by hand) on ${FRAMEWORK_LABEL[c.kind.framework]}`
              : c.subject.replace(/ \+ Redis$/, '');
        if (seen.has(subject)) continue;
        seen.add(subject);
        results.httpTrips.push(await countHttpTrips(c, subject, { ...services, redisUrl: countUrl }));
      }
    });

  // 3. Store micro-benchmarks, one fresh process per store.
  if (!args['no-micro']) {
    for (const store of stores)
      await stage(`store micro-benchmark ${store}`, async () => {
        const config: StoreBenchConfig = {
          store,
          services:
            (store === 'redis' || store === 'redis-node') && privateRedis
              ? { ...services, redisUrl: privateRedis.url }
              : services,
          duration: microDuration,
          concurrency: microConcurrency,
          countOps,
          keyPrefix: `${runId}-micro-${store}-`,
        };
        const result = await lastLine<StoreBenchResult>(
          startChild('src/store-bench.ts', config),
          `store-bench ${store}`,
        );
        results.stores.push(result);
        log(
          `store ${store.padEnd(9)} acquire+complete ${Math.round(result.acquireComplete)}/s  replay ${Math.round(result.replay)}/s  round trips ${result.tripsFirst ?? '-'} / ${result.tripsReplay ?? '-'} (${result.counter})`,
        );
      });
  }

  // 4. Memory per record (needs a private redis-server).
  if (!args['no-memory']) {
    if (hasRedisServer)
      await stage('memory per record', async () => {
        const proc = startChild('memory-per-record.ts', {}, ['--expose-gc'], {
          MEMORY_RECORDS: smoke ? '2000' : '20000',
        });
        results.memory = await lastLine<MemoryResult>(proc, 'memory-per-record');
        log(
          `memory per record: MemoryStore ${results.memory?.memoryStore} B, RedisStore ${results.memory?.redisStore} B`,
        );
      });
    else notes.push('Memory per record: no redis-server binary on this machine (it needs a private one).');
  }

  // 5. AWS Lambda cold starts: bundle sizes and import times of the same function with oncely and Powertools.
  if (!args['no-lambda'])
    await stage('lambda cold starts', async () => {
      results.lambda = await measureLambdaColdStart({ runs: smoke ? 2 : 40, warmup: smoke ? 0 : 3, log });
      if (results.lambda.imports.length === 0) throw new Error(results.lambda.failures.join('; '));
      for (const f of results.lambda.failures) notes.push(`Lambda cold starts: not measured: ${f}`);
    });

  // 6. Targets; with --report, a CPU profile of each case behind a missed target (and of its bare framework).
  const targets = evaluateTargets(results);
  for (const t of targets)
    log(
      `target ${t.met === undefined ? 'not measured' : t.met ? 'met    ' : 'NOT MET'}  ${t.name}: ${t.measured} (wanted ${t.want})`,
    );
  if (args.report && !smoke) {
    const toProfile = [
      ...new Set(targets.filter((t) => t.met === false && t.profileCase).map((t) => t.profileCase as string)),
    ];
    const profiledBaselines = new Map<string, ReturnType<typeof summariseProfile>>();
    for (const id of toProfile) {
      const c = cases.find((x) => x.id === id);
      if (c === undefined) continue;
      let summary: ReturnType<typeof summariseProfile>;
      try {
        summary = await profileCase(c);
      } catch (error) {
        notes.push(`Profile of ${id}: failed (${String(error).split('\n')[0]}).`);
        continue;
      }
      let baseline = profiledBaselines.get(c.baseline);
      if (baseline === undefined) {
        const b = cases.find((x) => x.id === c.baseline);
        if (b !== undefined) {
          baseline = await profileCase(b);
          profiledBaselines.set(c.baseline, baseline);
        }
      }
      const names = targets.filter((t) => t.met === false && t.profileCase === id).map((t) => t.name);
      const profile: ProfileResult = { target: names.join('; '), caseId: id, summary, baseline };
      results.profiles.push(profile);
    }
  }
} finally {
  await cleanup();
}

results.elapsedSec = (Date.now() - started) / 1000;
saveResults();

// The summary on stdout: the HTTP tables as the page has them.
console.log(`\nHTTP, median of ${rounds} round(s), ${duration} s per case, ${connections} connections`);
for (const r of results.http) {
  const ratio = ratioToBare(results, r);
  console.log(
    `${r.case.id.padEnd(42)} ${fmt(r.median)}${ratio === undefined ? '' : `  ${ratio.toFixed(2)}× bare`}`,
  );
}
if (args.report) {
  if (smoke) log('--report ignored with --smoke: the docs show full runs only');
  else writeReport(results);
}
log(`done in ${results.elapsedSec.toFixed(0)} s`);
process.exit(0);

async function countHttpTrips(c: HttpCase, subject: string, countServices: Services): Promise<TripsResult> {
  const monitor = await startMonitor(countServices.redisUrl, runId);
  const server = await startServer(c, countServices);
  const settle = () => new Promise((resolve) => setTimeout(resolve, 300));
  const send = async (key: string) => {
    const response = await fetch(server.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: (await import('./src/route')).REQUEST_BODY,
    });
    await response.arrayBuffer();
    if (response.status !== 201) throw new Error(`${subject}: ${response.status} while counting round trips`);
  };
  try {
    const keys = Array.from({ length: countOps }, (_, i) => `${runId}-trips-${c.id}-${i}`);
    // A first request (and its replay) before counting: it loads the Lua scripts (NOSCRIPT, then EVAL) and opens
    // connections, which a running server has long done.
    await send(`${runId}-trips-${c.id}-warm`);
    await send(`${runId}-trips-${c.id}-warm`);
    await settle();
    let before = monitor.count;
    for (const key of keys) await send(key);
    await settle();
    const first = (monitor.count - before) / countOps;
    before = monitor.count;
    for (const key of keys) await send(key);
    await settle();
    const replay = (monitor.count - before) / countOps;
    log(`round trips per request, ${subject}: first ${first}, replay ${replay}`);
    return { subject, first, replay };
  } finally {
    monitor.stop();
    await server.proc.stop();
  }
}

function printProfile(summary: ReturnType<typeof summariseProfile>): void {
  console.log(
    `${summary.file}: ${summary.totalMs.toFixed(0)} ms sampled, ${summary.idleMs.toFixed(0)} ms idle`,
  );
  for (const a of summary.areas) console.log(`  ${(a.share * 100).toFixed(1).padStart(5)}%  ${a.area}`);
  for (const f of summary.top)
    console.log(`  ${(f.share * 100).toFixed(1).padStart(5)}%  ${f.name}  ${f.where}  [${f.area}]`);
}

async function profileCase(c: HttpCase): Promise<ReturnType<typeof summariseProfile>> {
  // --cpu-prof writes one profile per thread (tsx's loader runs in a worker): a directory per run, then the
  // busiest profile (the main thread) is kept.
  const base = `${c.id.replace(/\//g, '_')}-${runId}`;
  const dir = join(PROFILE_DIR, base);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  log(`profiling ${c.id} (${duration} s under load) -> benchmarks/profiles/${base}.cpuprofile`);
  await measureCase(
    c,
    services,
    { ...load, nodeFlags: ['--cpu-prof', `--cpu-prof-dir=${dir}`] },
    `${runId}-profile-${c.id}-`,
  );
  let files: string[] = [];
  for (let i = 0; i < 50; i++) {
    files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
    if (files.length > 0) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const summaries = files.map((f) => summariseProfile(join(dir, f)));
  const main = summaries.sort((a, b) => b.totalMs - b.idleMs - (a.totalMs - a.idleMs))[0];
  if (main === undefined) throw new Error(`no profile written for ${c.id}`);
  const file = join(PROFILE_DIR, `${base}.cpuprofile`);
  renameSync(main.file, file);
  rmSync(dir, { recursive: true, force: true });
  return { ...main, file: `benchmarks/profiles/${base}.cpuprofile` };
}
