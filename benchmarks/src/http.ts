// The HTTP matrix: which servers, which scenarios, and one measurement of one case (a server in a fresh child
// process, loaded by autocannon running in the runner's own process).
import autocannon from 'autocannon';
import { type Child, firstLine, startChild } from './child';
import type { Framework, ServerKind, Services, StoreName } from './config';
import { cpuSeconds, perRequestUs, type StoreProcesses } from './cpu';
import { PATH, REQUEST_BODY } from './route';

/**
 * bare: the framework without middleware (requests still carry a new key each, so the load generator does the
 * same work as in `first`); first: a new Idempotency-Key per request; replay: keys cycling over a warm set;
 * nokey: the covered route without a key.
 */
export type Scenario = 'bare' | 'first' | 'replay' | 'nokey';
export const SCENARIOS: readonly Scenario[] = ['first', 'replay', 'nokey'];

export type Group = 'express' | 'fastify' | 'hono' | 'koa' | 'nest' | 'peers';

export interface HttpCase {
  id: string;
  group: Group;
  /** Who serves: 'Express', 'oncely + Redis', 'express-idempotency + memory', ... */
  subject: string;
  scenario: Scenario;
  kind: ServerKind;
  /** The id of the bare case this one is compared with. */
  baseline: string;
}

export const STORE_LABEL: Record<StoreName | 'none', string> = {
  memory: 'Memory',
  redis: 'Redis',
  'redis-node': 'Redis (node-redis)',
  postgres: 'PostgreSQL',
  mysql: 'MySQL',
  dynamodb: 'DynamoDB',
  none: 'none',
};

export const FRAMEWORK_LABEL: Record<Framework, string> = {
  express: 'Express',
  fastify: 'Fastify',
  hono: 'Hono',
  koa: 'Koa',
  nest: 'NestJS',
};

export interface MatrixOptions {
  frameworks: Framework[];
  stores: StoreName[];
  scenarios: Scenario[];
  peers: boolean;
  /** Add Fastify + Memory, first execution, with @oncely/opentelemetry on (when that case is in the matrix). */
  otel?: boolean;
}

/** Every case, in the order of a first round; bare cases are always in, since ratios need them. */
export function buildMatrix(options: MatrixOptions): HttpCase[] {
  const cases: HttpCase[] = [];
  for (const framework of options.frameworks) {
    const bare = `${framework}/bare`;
    cases.push({
      id: bare,
      group: framework,
      subject: `bare ${FRAMEWORK_LABEL[framework]}`,
      scenario: 'bare',
      kind: { impl: 'bare', framework },
      baseline: bare,
    });
    for (const store of options.stores) {
      // node-redis beside ioredis on the two main adapters only: the client is what differs, not the framework.
      if (store === 'redis-node' && framework !== 'express' && framework !== 'fastify') continue;
      for (const scenario of options.scenarios) {
        cases.push({
          id: `${framework}/oncely-${store}/${scenario}`,
          group: framework,
          subject: `oncely + ${STORE_LABEL[store]}`,
          scenario,
          kind: { impl: 'oncely', framework, store },
          baseline: bare,
        });
        // The floor beside oncely + Redis on the two main adapters: what the least atomic layer costs there.
        if (
          store === 'redis' &&
          (framework === 'express' || framework === 'fastify') &&
          scenario !== 'nokey'
        ) {
          cases.push({
            id: `${framework}/floor-redis/${scenario}`,
            group: framework,
            subject: 'floor (by hand) + Redis',
            scenario,
            kind: { impl: 'floor', framework, store: 'redis' },
            baseline: bare,
          });
        }
        if (options.otel === true && framework === 'fastify' && store === 'memory' && scenario === 'first') {
          cases.push({
            id: 'fastify/oncely-memory-otel/first',
            group: framework,
            subject: 'oncely + Memory + OpenTelemetry',
            scenario,
            kind: { impl: 'oncely', framework, store, otel: true },
            baseline: bare,
          });
        }
      }
    }
  }
  if (options.peers) {
    const peerStores = options.stores.filter((s): s is 'memory' | 'redis' => s === 'memory' || s === 'redis');
    if (peerStores.length > 0) {
      if (!options.frameworks.includes('express')) {
        cases.push({
          id: 'express/bare',
          group: 'express',
          subject: 'bare Express',
          scenario: 'bare',
          kind: { impl: 'bare', framework: 'express' },
          baseline: 'express/bare',
        });
      }
      if (!options.frameworks.includes('nest')) {
        cases.push({
          id: 'nest/bare',
          group: 'nest',
          subject: 'bare NestJS',
          scenario: 'bare',
          kind: { impl: 'bare', framework: 'nest' },
          baseline: 'nest/bare',
        });
      }
      for (const store of peerStores) {
        for (const scenario of options.scenarios) {
          cases.push({
            id: `peers/express-idempotency-${store}/${scenario}`,
            group: 'peers',
            subject: `express-idempotency + ${STORE_LABEL[store]}`,
            scenario,
            kind: { impl: 'express-idempotency', store },
            baseline: 'express/bare',
          });
          cases.push({
            id: `peers/node-idempotency-${store}/${scenario}`,
            group: 'peers',
            subject: `@node-idempotency/nestjs + ${STORE_LABEL[store]}`,
            scenario,
            kind: { impl: 'nest', store },
            baseline: 'nest/bare',
          });
        }
      }
    }
  }
  return cases;
}

/** Round r's order: the cases of the groups interleaved (bare and covered servers alternate), reversed every other round. */
export function roundOrder(cases: HttpCase[], round: number): HttpCase[] {
  const byGroup = new Map<string, HttpCase[]>();
  for (const c of cases) {
    const list = byGroup.get(c.group) ?? [];
    list.push(c);
    byGroup.set(c.group, list);
  }
  const lists = [...byGroup.values()];
  const order: HttpCase[] = [];
  for (let i = 0; order.length < cases.length; i++) {
    for (const list of lists) {
      const c = list[i];
      if (c !== undefined) order.push(c);
    }
  }
  return round % 2 === 0 ? order : order.reverse();
}

export interface Measurement {
  rps: number;
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
  requests: number;
  /** CPU µs (user + system) per request of the server process over the measured window; undefined: not read. */
  cpuServerUs?: number | undefined;
  /** The same of the store's server (Redis, PostgreSQL), when it runs on this machine. */
  cpuStoreUs?: number | undefined;
}

export interface LoadOptions {
  duration: number;
  warmup: number;
  connections: number;
  /** Number of warm keys in `replay`. */
  replayKeys: number;
  /** Extra node flags for the server (--cpu-prof ...). */
  nodeFlags?: string[];
  /** The store servers' processes, whose CPU time is read around the measured window. */
  storeProcesses?: Partial<Record<'redis' | 'postgres' | 'mysql', StoreProcesses>>;
}

function storeProcessesOf(c: HttpCase, options: LoadOptions): StoreProcesses | undefined {
  const store = 'store' in c.kind ? c.kind.store : undefined;
  if (store === 'redis' || store === 'redis-node') return options.storeProcesses?.redis;
  if (store === 'postgres') return options.storeProcesses?.postgres;
  if (store === 'mysql') return options.storeProcesses?.mysql;
  return undefined;
}

const HEADERS = { 'content-type': 'application/json' };

function load(
  url: string,
  seconds: number,
  connections: number,
  nextKey: () => string | undefined,
): Promise<autocannon.Result> {
  return new Promise((resolve, reject) => {
    autocannon(
      {
        url,
        method: 'POST',
        connections,
        duration: seconds,
        headers: HEADERS,
        body: REQUEST_BODY,
        requests: [
          {
            // Every scenario builds its request here, so the load generator's work is the same in each.
            setupRequest: (request) => {
              const key = nextKey();
              if (key !== undefined) (request.headers as Record<string, string>)['idempotency-key'] = key;
              return request;
            },
          },
        ],
      },
      (error, result) => (error ? reject(error) : resolve(result)),
    );
  });
}

async function post(url: string, key: string): Promise<Response> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { ...HEADERS, 'idempotency-key': key },
    body: REQUEST_BODY,
  });
  await response.arrayBuffer();
  return response;
}

export interface StartedServer {
  url: string;
  proc: Child;
}

export async function startServer(
  c: HttpCase,
  services: Services,
  nodeFlags: string[] = [],
): Promise<StartedServer> {
  const proc = startChild('src/server.ts', { kind: c.kind, services }, nodeFlags);
  const { port } = await firstLine<{ port: number }>(proc, `server ${c.id}`);
  return { url: `http://127.0.0.1:${port}${PATH}`, proc };
}

/** Starts the case's server, prepares it (warm keys, warm-up load), measures, stops it. */
export async function measureCase(
  c: HttpCase,
  services: Services,
  options: LoadOptions,
  keyPrefix: string,
): Promise<Measurement> {
  const server = await startServer(c, services, options.nodeFlags);
  try {
    let nextKey: () => string | undefined;
    if (c.scenario === 'nokey') {
      nextKey = () => undefined;
    } else if (c.scenario === 'replay') {
      const keys = Array.from({ length: options.replayKeys }, (_, i) => `${keyPrefix}w${i}`);
      for (const key of keys) {
        const response = await post(server.url, key);
        if (response.status !== 201)
          throw new Error(`${c.id}: warming key ${key} answered ${response.status}`);
      }
      // The peers store the response after sending it: give them a moment before checking.
      await new Promise((resolve) => setTimeout(resolve, 100));
      const check = await post(server.url, keys[0] as string);
      if (check.status !== 201) throw new Error(`${c.id}: a replay answered ${check.status}`);
      if (
        (c.kind.impl === 'oncely' || c.kind.impl === 'floor') &&
        check.headers.get('idempotent-replayed') !== 'true'
      )
        throw new Error(`${c.id}: the warm key was not replayed`);
      let i = 0;
      nextKey = () => keys[i++ % keys.length];
    } else {
      let n = 0;
      nextKey = () => `${keyPrefix}${n++}`;
    }
    if (options.warmup > 0) await load(server.url, options.warmup, options.connections, nextKey);
    const pid = server.proc.child.pid;
    const storeProcesses = storeProcessesOf(c, options);
    const serverBefore = pid === undefined ? undefined : cpuSeconds(pid);
    const storeBefore = storeProcesses?.read();
    const result = await load(server.url, options.duration, options.connections, nextKey);
    // autocannon stops counting at the end of its window; the few responses still in flight cost CPU that is
    // read here too (one per connection, against tens of thousands counted).
    const serverAfter = pid === undefined ? undefined : cpuSeconds(pid);
    const storeAfter = storeProcesses?.read();
    if (server.proc.child.exitCode !== null)
      throw new Error(`${c.id}: the server died\n${server.proc.stderr()}`);
    const requests = result.requests.total;
    if (requests === 0) throw new Error(`${c.id}: no request completed\n${server.proc.stderr()}`);
    return {
      rps: requests / result.duration,
      p50: result.latency.p50,
      p99: result.latency.p99,
      non2xx: result.non2xx,
      errors: result.errors + result.timeouts,
      requests,
      cpuServerUs: perRequestUs(serverBefore, serverAfter, requests),
      cpuStoreUs: perRequestUs(storeBefore, storeAfter, requests),
    };
  } finally {
    await server.proc.stop();
  }
}
