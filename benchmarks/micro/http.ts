// What an HTTP adapter costs per request over real sockets: the bare framework and oncely + Memory in one
// process, loaded in turns by autocannon in a child process (micro/http-load.ts), CPU time (user + system) of this
// process per request read around each turn. One process and alternating turns: the JIT, the heap and the
// machine's drift are the same for both, so differences of ~10 µs show, which the runner's ±30% between runs
// hides. Real sockets, not inject(): light-my-request's objects do not take the prototypes Node's do (what costs
// most on Express, properties added after its `setPrototypeOf`, does not show through them), and on Hono
// @hono/node-server's lightweight Request and Response only exist over a Node server.
// `node --conditions=@oncely/source --import tsx micro/http.ts <express|fastify|hono|koa> [first|replay]` in
// benchmarks/ (on the sources), or `pnpm --filter @oncely/benchmarks micro:http hono first`. Prints per variant:
// CPU µs per request (median of turns), its user part, the part of other threads (GC helpers), and the main
// thread's GC pauses per request by kind.
// ONLY=oncely (or bare, or otel) serves one variant, for a profile (`--cpu-prof`) of it alone; ALLOC=<file> writes a
// heap allocation profile of the measured turns. OTEL=on adds oncely + Memory + OpenTelemetry's metrics (issue 14).
// On the sources, tsx wraps each named closure in esbuild's `__name` (about 1 µs per Hono request, in profiles);
// without `--conditions=@oncely/source` it measures the built `dist/` (build first), which has none.
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { Session } from 'node:inspector/promises';
import type { AddressInfo } from 'node:net';
import { PerformanceObserver, constants as perfConstants } from 'node:perf_hooks';
import { MemoryStore } from '@oncely/core';
import { otelOptions } from '../src/otel';
import { type ChargeRequest, charge, PATH } from '../src/route';

// oncely's options for a covered server (MemoryStore, and with OTEL=on OpenTelemetry's hooks), or false for bare.
type Covered = false | ({ store: MemoryStore } & Partial<Awaited<ReturnType<typeof otelOptions>>>);

const framework = process.argv[2] ?? 'express';
const scenario = process.argv[3] === 'replay' ? 'replay' : 'first';
const turns = Number(process.env.TURNS ?? 6);
const seconds = Number(process.env.SECONDS ?? 3);

async function express(covered: Covered): Promise<Server> {
  const { default: express } = await import('express');
  const app = express();
  app.use(express.json());
  if (covered) app.use((await import('@oncely/express')).idempotency(covered));
  app.post(PATH, (req, res) => void res.status(201).json(charge(req.body as ChargeRequest)));
  return createServer(app);
}

async function hono(covered: Covered): Promise<Server> {
  const { Hono } = await import('hono');
  const { getRequestListener } = await import('@hono/node-server');
  const app = new Hono();
  if (covered) app.use((await import('@oncely/hono')).idempotency(covered));
  app.post(PATH, async (c) => c.json(charge(await c.req.json<ChargeRequest>()), 201));
  return createServer(getRequestListener(app.fetch));
}

async function koa(covered: Covered): Promise<Server> {
  const { default: Koa } = await import('koa');
  const { bodyParser } = await import('@koa/bodyparser');
  const app = new Koa();
  app.use(bodyParser());
  if (covered) app.use((await import('@oncely/koa')).idempotency(covered));
  app.use((ctx) => {
    if (ctx.method !== 'POST' || ctx.path !== PATH) return;
    ctx.status = 201;
    ctx.body = charge(ctx.request.body as ChargeRequest);
  });
  return createServer(app.callback());
}

async function fastify(covered: Covered): Promise<Server> {
  const { default: Fastify } = await import('fastify');
  const app = Fastify({ logger: false });
  if (covered) await app.register((await import('@oncely/fastify')).idempotencyPlugin, covered);
  app.post(PATH, async (request, reply) => {
    reply.code(201);
    return charge(request.body as ChargeRequest);
  });
  await app.ready();
  return app.server;
}

const servers = { express, fastify, hono, koa } as const;
if (!(framework in servers))
  throw new Error(`micro/http.ts: no server for ${framework} (express, hono, koa)`);

async function listen(covered: Covered): Promise<number> {
  const server = await servers[framework as keyof typeof servers](covered);
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port));
  });
}

// A replay run's first requests for one of its 100 keys run together: the ones behind the first get a 409 until
// it completes, which the warm-up allows (`warmUp`: 409s only); the measured turns replay completed keys only.
function load(port: number, duration: number, warmUp = false): Promise<number> {
  return new Promise((resolve, reject) => {
    const args = ['--import', 'tsx', 'micro/http-load.ts', String(port), String(duration), scenario];
    execFile(process.execPath, args, (error, stdout) => {
      if (error) return reject(error);
      const { answered, non2xx, conflicts } = JSON.parse(stdout) as {
        answered: number;
        non2xx: number;
        conflicts: number;
      };
      const unexpected = warmUp ? non2xx - conflicts : non2xx;
      if (unexpected > 0)
        return reject(new Error(`${unexpected} answers were not 2xx${warmUp ? ' or 409' : ''}`));
      resolve(answered);
    });
  });
}

// ONLY=<variant> serves that one alone (for a profile); OTEL=on adds a third variant, oncely + Memory with otel()
// over an SDK MeterProvider (src/otel.ts): the cost of issue 14's metrics beside the same server without them.
const only = process.env.ONLY;
const wanted =
  only === undefined ? ['bare', 'oncely', ...(process.env.OTEL === 'on' ? ['otel'] : [])] : [only];
const ports: Record<string, number> = {};
for (const name of wanted) {
  if (name === 'bare') ports.bare = await listen(false);
  else if (name === 'oncely') ports.oncely = await listen({ store: new MemoryStore() });
  else if (name === 'otel') ports.otel = await listen({ store: new MemoryStore(), ...(await otelOptions()) });
  else throw new Error(`micro/http.ts: ONLY=${name} is not a variant (bare, oncely, otel)`);
}
const names = Object.keys(ports);
// Warm-up: the JIT, and MemoryStore's LRU filling up, as under load.
for (const name of names) await load(ports[name] as number, 2, true);

// ALLOC=file writes a sampling heap profile of the measured turns (every allocation, collected or not), for
// the bytes each function allocates per request.
const session = new Session();
if (process.env.ALLOC) {
  session.connect();
  await session.post('HeapProfiler.startSampling', {
    samplingInterval: 512,
    includeObjectsCollectedByMajorGC: true,
    includeObjectsCollectedByMinorGC: true,
  } as import('node:inspector').HeapProfiler.StartSamplingParameterType);
}

interface Variant {
  cpu: number[]; // user + system µs per request, per turn
  user: number[];
  others: number[]; // of cpu: the threads other than the main one (GC helpers, libuv's pool), µs per request
  answered: number;
  gcMs: number[]; // main-thread pause by kind: [minor, major, incremental, weak callbacks]
}
const variants: Record<string, Variant> = Object.fromEntries(
  names.map((name) => [name, { cpu: [], user: [], others: [], answered: 0, gcMs: [0, 0, 0, 0] }]),
);
let measuring: Variant | undefined;
// perf_hooks.constants: NODE_PERFORMANCE_GC_MINOR, _MAJOR, _INCREMENTAL, _WEAKCB, in the order of gcMs.
const GC_KINDS = [
  perfConstants.NODE_PERFORMANCE_GC_MINOR,
  perfConstants.NODE_PERFORMANCE_GC_MAJOR,
  perfConstants.NODE_PERFORMANCE_GC_INCREMENTAL,
  perfConstants.NODE_PERFORMANCE_GC_WEAKCB,
];
new PerformanceObserver((list) => {
  if (measuring === undefined) return;
  for (const entry of list.getEntries()) {
    const index = GC_KINDS.indexOf((entry as { detail?: { kind?: number } }).detail?.kind ?? -1);
    if (index !== -1) (measuring.gcMs[index] as number) += entry.duration;
  }
}).observe({ entryTypes: ['gc'] });

// CPU time of this process's threads other than the main one, in ms, from /proc (Linux; clock ticks of 10 ms, so
// read over whole turns only): what GC's helper threads and libuv's pool take beside the main thread's work.
function otherThreadsMs(): number {
  let ticks = 0;
  try {
    for (const tid of readdirSync('/proc/self/task')) {
      if (Number(tid) === process.pid) continue;
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(fields[11]) + Number(fields[12]); // utime and stime: fields 14 and 15 of stat(5)
    }
  } catch {
    return Number.NaN; // not Linux
  }
  return ticks * 10;
}

for (let t = 0; t < turns; t++) {
  // Alternate the order every turn, so neither always follows the other.
  for (let i = 0; i < names.length; i++) {
    const name = names[(i + t) % names.length] as string;
    const variant = variants[name] as Variant;
    measuring = variant;
    const before = process.cpuUsage();
    const othersBefore = otherThreadsMs();
    const answered = await load(ports[name] as number, seconds);
    const used = process.cpuUsage(before);
    variant.others.push(((otherThreadsMs() - othersBefore) * 1000) / answered);
    measuring = undefined;
    variant.cpu.push((used.user + used.system) / answered);
    variant.user.push(used.user / answered);
    variant.answered += answered;
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1] as number;
console.log(`${framework} over HTTP, ${scenario}, ${turns} turns of ${seconds} s: server CPU µs per request`);
const bare = variants.bare;
for (const name of names) {
  const { cpu, user, others, answered, gcMs } = variants[name] as Variant;
  const m = median(cpu);
  // OpenTelemetry's variant is compared with oncely without it; oncely with bare.
  const base = name === 'otel' ? variants.oncely : name === 'bare' ? undefined : bare;
  const over =
    base === undefined
      ? ''
      : `  (+${(m - median(base.cpu)).toFixed(1)} over ${name === 'otel' ? 'oncely' : 'bare'})`;
  const gc = gcMs.map((ms) => ((ms * 1000) / answered).toFixed(2)).join(' / ');
  console.log(
    `${name.padEnd(7)} median ${m.toFixed(1)}${over}  turns ${cpu.map((x) => x.toFixed(0)).join(' ')}  ` +
      `user ${median(user).toFixed(1)}  other threads ${median(others).toFixed(1)}  GC pause minor/major/incremental/weak ${gc}  (${answered} requests)`,
  );
}
if (process.env.ALLOC) {
  const { profile } = await session.post('HeapProfiler.stopSampling');
  writeFileSync(process.env.ALLOC, JSON.stringify(profile));
}
process.exit(0);
