// The shape of one run's results (saved as JSON, read back by the report) and the targets of issue 7.
import type { HttpCase, Measurement } from './http';
import type { LambdaColdStart } from './lambda';
import type { Machine } from './machine';
import type { ProfileSummary } from './profile';
import type { StoreBenchResult } from './store-bench-types';

export interface CaseResult {
  case: HttpCase;
  rounds: Measurement[];
  median: Measurement;
}

export interface TripsResult {
  subject: string;
  first: number;
  replay: number;
}

export interface MemoryResult {
  records: number;
  memoryStore: number;
  redisStore: number;
  redisMemoryUsage: number;
  redisEncoding: string;
}

export interface ProfileResult {
  target: string;
  caseId: string;
  summary: ProfileSummary;
  baseline?: ProfileSummary | undefined;
}

export interface RunResults {
  date: string;
  command: string;
  runId: string;
  /** `git describe --always --dirty` of the tree the packages were built from. */
  commit?: string;
  elapsedSec: number;
  smoke: boolean;
  options: {
    duration: number;
    warmup: number;
    rounds: number;
    connections: number;
    replayKeys: number;
    microDuration: number;
    microConcurrency: number;
    countOps: number;
  };
  machine: Machine;
  http: CaseResult[];
  stores: StoreBenchResult[];
  /** Redis commands per HTTP request, counted with MONITOR. */
  httpTrips: TripsResult[];
  tripsCounter: string;
  memory: MemoryResult | null;
  /** AWS Lambda cold starts (absent in results saved before it was measured). */
  lambda?: LambdaColdStart | null;
  profiles: ProfileResult[];
  /** What was left out, and why. */
  notes: string[];
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  if (sorted.length === 0) return Number.NaN;
  return sorted.length % 2 === 1
    ? (sorted[mid] as number)
    : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

export function medianOf(rounds: Measurement[]): Measurement {
  const pick = (f: (m: Measurement) => number) => median(rounds.map(f));
  return {
    rps: pick((m) => m.rps),
    p50: pick((m) => m.p50),
    p99: pick((m) => m.p99),
    non2xx: pick((m) => m.non2xx),
    errors: pick((m) => m.errors),
    requests: pick((m) => m.requests),
    cpuServerUs: pickDefined(rounds.map((m) => m.cpuServerUs)),
    cpuStoreUs: pickDefined(rounds.map((m) => m.cpuStoreUs)),
  };
}

/** The median of the rounds that have the reading; undefined when none has. */
function pickDefined(values: (number | undefined)[]): number | undefined {
  const defined = values.filter((v): v is number => v !== undefined);
  return defined.length === 0 ? undefined : median(defined);
}

export function findCase(results: RunResults, id: string): CaseResult | undefined {
  return results.http.find((r) => r.case.id === id);
}

/** requests/s of a case over its bare baseline's, both medians of the same run. */
export function ratioToBare(results: RunResults, r: CaseResult): number | undefined {
  const base = findCase(results, r.case.baseline);
  if (base === undefined) return undefined;
  return r.median.rps / base.median.rps;
}

export interface Target {
  name: string;
  want: string;
  measured: string;
  /** undefined: not measured in this run. */
  met: boolean | undefined;
  /** The case to profile when not met. */
  profileCase?: string;
}

export function evaluateTargets(results: RunResults): Target[] {
  const targets: Target[] = [];
  const ratioTarget = (framework: string, store: string, scenario: string, min: number, label: string) => {
    const id = `${framework}/oncely-${store}/${scenario}`;
    const r = findCase(results, id);
    const ratio = r === undefined ? undefined : ratioToBare(results, r);
    targets.push({
      name: `${label}: ${scenario === 'first' ? 'first execution' : 'replay'} vs bare ${label.split(' ')[0]}`,
      want: `≥ ${min.toFixed(2)}×`,
      measured: ratio === undefined ? 'not measured' : `${ratio.toFixed(2)}×`,
      met: ratio === undefined ? undefined : ratio >= min,
      profileCase: id,
    });
  };
  ratioTarget('fastify', 'memory', 'first', 0.9, 'Fastify + Memory');
  ratioTarget('fastify', 'memory', 'replay', 0.95, 'Fastify + Memory');
  ratioTarget('express', 'memory', 'first', 0.8, 'Express + Memory');
  ratioTarget('express', 'memory', 'replay', 0.95, 'Express + Memory');
  ratioTarget('hono', 'memory', 'first', 0.85, 'Hono + Memory');
  ratioTarget('hono', 'memory', 'replay', 0.95, 'Hono + Memory');
  ratioTarget('koa', 'memory', 'first', 0.85, 'Koa + Memory');
  ratioTarget('koa', 'memory', 'replay', 0.95, 'Koa + Memory');
  ratioTarget('fastify', 'redis', 'first', 0.6, 'Fastify + Redis');
  ratioTarget('fastify', 'redis', 'replay', 0.8, 'Fastify + Redis');
  {
    // OpenTelemetry's cost: the same case with otel() on (metrics recorded by the SDK, no-op exporter) over off.
    const on = findCase(results, 'fastify/oncely-memory-otel/first');
    const off = findCase(results, 'fastify/oncely-memory/first');
    const ratio = on !== undefined && off !== undefined ? on.median.rps / off.median.rps : undefined;
    targets.push({
      name: 'Fastify + Memory first execution: with OpenTelemetry vs without',
      want: '≥ 0.95×',
      measured: ratio === undefined ? 'not measured' : `${ratio.toFixed(2)}×`,
      met: ratio === undefined ? undefined : ratio >= 0.95,
      profileCase: 'fastify/oncely-memory-otel/first',
    });
  }
  // CPU per request against the floor (src/floor.ts): Redis's, and the server's, on Express and Fastify.
  for (const framework of ['fastify', 'express'] as const) {
    for (const scenario of ['first', 'replay'] as const) {
      const ours = findCase(results, `${framework}/oncely-redis/${scenario}`);
      const floor = findCase(results, `${framework}/floor-redis/${scenario}`);
      const label = `${framework === 'fastify' ? 'Fastify' : 'Express'} + Redis, ${scenario === 'first' ? 'first execution' : 'replay'}`;
      const cpuTarget = (what: string, pick: (m: Measurement) => number | undefined, max: number) => {
        const a = ours === undefined ? undefined : pick(ours.median);
        const b = floor === undefined ? undefined : pick(floor.median);
        const ratio = a !== undefined && b !== undefined && b > 0 ? a / b : undefined;
        targets.push({
          name: `${label}: ${what} CPU per request vs the floor`,
          want: `≤ ${max.toFixed(2)}×`,
          measured:
            ratio === undefined
              ? 'not measured'
              : `${(a as number).toFixed(1)} vs ${(b as number).toFixed(1)} µs: ${ratio.toFixed(2)}×`,
          met: ratio === undefined ? undefined : ratio <= max,
          profileCase: `${framework}/oncely-redis/${scenario}`,
        });
      };
      cpuTarget('Redis', (m) => m.cpuStoreUs, scenario === 'first' ? 1.3 : 1.2);
      cpuTarget('server', (m) => m.cpuServerUs, framework === 'fastify' ? 1.15 : 1.25);
    }
  }
  for (const scenario of ['first', 'replay'] as const) {
    const ours = findCase(results, `express/oncely-redis/${scenario}`);
    const wanted = scenario === 'first' ? 1.2 : 1.3;
    for (const [peer, label] of [
      ['express-idempotency', 'express-idempotency + Redis'],
      ['node-idempotency', '@node-idempotency/nestjs + Redis'],
    ] as const) {
      const theirs = findCase(results, `peers/${peer}-redis/${scenario}`);
      const ratio =
        ours !== undefined && theirs !== undefined ? ours.median.rps / theirs.median.rps : undefined;
      targets.push({
        name: `Express + Redis vs ${label}: ${scenario === 'first' ? 'first execution' : 'replay'}`,
        want: `≥ ${wanted.toFixed(2)}×`,
        measured: ratio === undefined ? 'not measured' : `${ratio.toFixed(2)}×`,
        met: ratio === undefined ? undefined : ratio >= wanted,
        profileCase: `express/oncely-redis/${scenario}`,
      });
    }
  }
  for (const scenario of ['first', 'replay'] as const) {
    const ours = findCase(results, `nest/oncely-redis/${scenario}`);
    const theirs = findCase(results, `peers/node-idempotency-redis/${scenario}`);
    const ratio =
      ours !== undefined && theirs !== undefined ? ours.median.rps / theirs.median.rps : undefined;
    targets.push({
      name: `NestJS + Redis vs @node-idempotency/nestjs + Redis on the same Nest app: ${scenario === 'first' ? 'first execution' : 'replay'}`,
      want: '≥ 1.30×',
      measured: ratio === undefined ? 'not measured' : `${ratio.toFixed(2)}×`,
      met: ratio === undefined ? undefined : ratio >= 1.3,
      profileCase: `nest/oncely-redis/${scenario}`,
    });
  }
  const redis = results.stores.find((s) => s.store === 'redis');
  const oncelyHttp = results.httpTrips.filter((t) => t.subject.startsWith('oncely'));
  const tripsText = (first: number | null | undefined, replay: number | null | undefined) =>
    first === undefined || first === null || replay === undefined || replay === null
      ? undefined
      : `${fmtTrips(first)} and ${fmtTrips(replay)}`;
  const storeTrips = tripsText(redis?.tripsFirst, redis?.tripsReplay);
  // Each count is in the tables below; the cell names only the setups that are off the target, to stay short.
  const counted = [
    ...(storeTrips === undefined ? [] : [{ subject: 'store', trips: storeTrips }]),
    ...oncelyHttp.map((t) => ({ subject: t.subject, trips: tripsText(t.first, t.replay) })),
  ];
  const offTarget = counted.filter((c) => c.trips !== '2 and 1');
  const allTrips = [
    ...(redis?.tripsFirst != null && redis.tripsReplay != null
      ? [[redis.tripsFirst, redis.tripsReplay]]
      : []),
    ...oncelyHttp.map((t) => [t.first, t.replay]),
  ];
  targets.push({
    name: 'Redis round trips: first execution and replay',
    want: '2 and 1',
    measured:
      counted.length === 0
        ? 'not measured'
        : offTarget.length === 0
          ? `2 and 1 in all ${counted.length} (${storeTrips === undefined ? '' : 'the store and '}each oncely server below)`
          : offTarget.map((c) => `${c.subject}: ${c.trips ?? 'not counted'}`).join('; '),
    met: allTrips.length === 0 ? undefined : allTrips.every(([f, r]) => f === 2 && r === 1),
  });
  return targets;
}

export function fmtTrips(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}
