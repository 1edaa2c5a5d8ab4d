// Summarises a V8 .cpuprofile (node --cpu-prof): self time per function, and per area (oncely's packages, the
// framework, the Redis/PostgreSQL client, Node's HTTP stack, GC, idle).
import { readFileSync } from 'node:fs';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  hitCount?: number;
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
  timeDeltas?: number[];
}

export interface HotFunction {
  name: string;
  where: string;
  area: string;
  selfMs: number;
  /** Share of the non-idle time. */
  share: number;
}

export interface ProfileSummary {
  file: string;
  totalMs: number;
  idleMs: number;
  top: HotFunction[];
  areas: { area: string; selfMs: number; share: number }[];
}

export function areaOf(url: string, name: string): string {
  if (name === '(garbage collector)') return 'GC';
  if (name === '(idle)') return 'idle';
  if (name === '(program)') return 'V8/native (program)';
  if (url === '') return 'V8/native (program)';
  if (/\/packages\/core\//.test(url) || /@oncely\/core/.test(url)) return 'oncely core';
  if (/\/packages\/express\//.test(url) || /@oncely\/express/.test(url)) return 'oncely express';
  if (/\/packages\/fastify\//.test(url) || /@oncely\/fastify/.test(url)) return 'oncely fastify';
  if (/\/packages\/(?:web|hono)\//.test(url) || /@oncely\/(?:web|hono)/.test(url)) return 'oncely web/hono';
  if (/\/packages\/koa\//.test(url) || /@oncely\/koa/.test(url)) return 'oncely koa';
  if (/\/packages\/nestjs\//.test(url) || /@oncely\/nestjs/.test(url)) return 'oncely nestjs';
  if (/\/packages\/redis\//.test(url) || /@oncely\/redis/.test(url)) return 'oncely redis';
  if (/\/packages\/postgres\//.test(url) || /@oncely\/postgres/.test(url)) return 'oncely postgres';
  if (/\/packages\/dynamodb\//.test(url) || /@oncely\/dynamodb/.test(url)) return 'oncely dynamodb';
  const pkg = /node_modules\/(?:\.pnpm\/[^/]+\/node_modules\/)?((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (pkg !== null) {
    const name = pkg[1] as string;
    if (['ioredis', 'redis-parser', 'denque', 'standard-as-callback', 'cluster-key-slot'].includes(name))
      return 'ioredis';
    if (name.startsWith('pg') || name === 'postgres-bytea') return 'pg';
    if (name.startsWith('@redis/') || name === 'redis') return 'node-redis';
    if (name === 'express' || name === 'router' || name === 'body-parser' || name.includes('express'))
      return `framework (${name})`;
    if (name.includes('fastify') || name === 'find-my-way' || name === 'light-my-request' || name === 'avvio')
      return `framework (${name})`;
    if (name.startsWith('@nestjs') || name === 'rxjs') return `framework (${name})`;
    if (name === 'hono' || name === '@hono/node-server') return `framework (${name})`;
    if (name === 'koa' || name.startsWith('@koa/') || name === 'co-body' || name === 'koa-compose')
      return `framework (${name})`;
    return `npm: ${name}`;
  }
  if (url.startsWith('node:')) {
    if (/node:(_http|http|net|stream|internal\/streams|internal\/http|internal\/stream)/.test(url))
      return 'Node http/net/streams';
    return 'Node (other)';
  }
  if (url.includes('/benchmarks/')) return 'benchmark server';
  return 'other';
}

export function summariseProfile(file: string, topN = 15): ProfileSummary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  for (let i = 0; i < samples.length; i++) {
    const id = samples[i] as number;
    // timeDeltas[i] is the time before sample i; attribute the next delta to this sample.
    const dt = deltas[i + 1] ?? 0;
    selfUs.set(id, (selfUs.get(id) ?? 0) + Math.max(0, dt));
  }
  const byFunction = new Map<string, HotFunction>();
  const byArea = new Map<string, number>();
  let totalUs = 0;
  let idleUs = 0;
  for (const [id, us] of selfUs) {
    const node = byId.get(id);
    if (node === undefined) continue;
    const { functionName, url, lineNumber } = node.callFrame;
    const name = functionName === '' ? '(anonymous)' : functionName;
    const area = areaOf(url, name);
    totalUs += us;
    if (area === 'idle') idleUs += us;
    byArea.set(area, (byArea.get(area) ?? 0) + us);
    const short = url
      .replace(/^.*\/node_modules\/(?:\.pnpm\/[^/]+\/node_modules\/)?/, '')
      .replace(/^.*\/work\/[^/]+\//, '');
    const where = url === '' ? '' : `${short}:${lineNumber + 1}`;
    const key = `${name}@${where}`;
    const entry = byFunction.get(key) ?? { name, where, area, selfMs: 0, share: 0 };
    entry.selfMs += us / 1000;
    byFunction.set(key, entry);
  }
  const busyMs = (totalUs - idleUs) / 1000;
  const top = [...byFunction.values()]
    .filter((f) => f.area !== 'idle')
    .sort((a, b) => b.selfMs - a.selfMs)
    .slice(0, topN)
    .map((f) => ({ ...f, share: busyMs > 0 ? f.selfMs / busyMs : 0 }));
  const areas = [...byArea.entries()]
    .filter(([area]) => area !== 'idle')
    .map(([area, us]) => ({ area, selfMs: us / 1000, share: busyMs > 0 ? us / 1000 / busyMs : 0 }))
    .sort((a, b) => b.selfMs - a.selfMs);
  return { file, totalMs: totalUs / 1000, idleMs: idleUs / 1000, top, areas };
}

// `node --import tsx src/profile.ts file.cpuprofile` prints the summary.
if (process.argv[1] !== undefined && import.meta.url.endsWith(process.argv[1].replace(/^.*\//, ''))) {
  for (const file of process.argv.slice(2)) {
    const summary = summariseProfile(file);
    console.log(`${file}: ${summary.totalMs.toFixed(0)} ms sampled, ${summary.idleMs.toFixed(0)} ms idle`);
    for (const a of summary.areas) console.log(`  ${(a.share * 100).toFixed(1).padStart(5)}%  ${a.area}`);
    for (const f of summary.top)
      console.log(`  ${(f.share * 100).toFixed(1).padStart(5)}%  ${f.name}  ${f.where}  [${f.area}]`);
  }
}
