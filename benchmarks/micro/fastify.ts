// What oncely's Fastify adapter costs per request, without sockets: bare Fastify, oncely + Memory and oncely +
// Memory + OpenTelemetry (metrics on, SDK with an exporter that drops everything) in one process, loaded in turns
// with `fastify.inject()` (32 in flight), CPU time (user + system) per request read around each turn. One process
// and alternating turns: the JIT, the heap and the machine's drift are the same for every variant, so differences
// of a few µs show, which autocannon's ±30% between runs hides. inject() costs ~10-20 µs of its own, the same in
// every variant: compare differences, not ratios.
// `node --conditions=@oncely/source --import tsx micro/fastify.ts [first|replay]` in benchmarks/ (on the sources).
import { MemoryStore } from '@oncely/core';
import { idempotencyPlugin } from '@oncely/fastify';
import Fastify, { type FastifyInstance } from 'fastify';
import { otelOptions } from '../src/otel';
import { type ChargeRequest, charge, PATH, REQUEST_BODY } from '../src/route';

const scenario = process.argv[2] === 'replay' ? 'replay' : 'first';
const turns = Number(process.env.TURNS ?? 15);
const perTurn = Number(process.env.REQUESTS ?? 5000);
const inFlight = 32;

async function app(variant: 'bare' | 'oncely' | 'otel'): Promise<FastifyInstance> {
  const fastify = Fastify({ logger: false });
  if (variant !== 'bare') {
    await fastify.register(idempotencyPlugin, {
      store: new MemoryStore(),
      ...(variant === 'otel' ? await otelOptions() : {}),
    });
  }
  fastify.post(PATH, async (request, reply) => {
    reply.code(201);
    return charge(request.body as ChargeRequest);
  });
  await fastify.ready();
  return fastify;
}

const variants = { bare: await app('bare'), oncely: await app('oncely'), otel: await app('otel') };
let n = 0;
const keyOf = scenario === 'first' ? () => `k${n++}` : () => `warm-${n++ % 100}`;

async function turn(fastify: FastifyInstance, count: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < count) {
      next++;
      const response = await fastify.inject({
        method: 'POST',
        url: PATH,
        headers: { 'content-type': 'application/json', 'idempotency-key': keyOf() },
        payload: REQUEST_BODY,
      });
      if (response.statusCode !== 201) throw new Error(`answered ${response.statusCode}`);
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
}

// Warm-up: the JIT, and MemoryStore's LRU full (10,000 records), as under load.
for (const fastify of Object.values(variants)) await turn(fastify, 20_000);

const cpu: Record<keyof typeof variants, number[]> = { bare: [], oncely: [], otel: [] };
const names = Object.keys(variants) as (keyof typeof variants)[];
for (let t = 0; t < turns; t++) {
  // Rotate the order every turn, so no variant always follows the same one.
  for (let i = 0; i < names.length; i++) {
    const name = names[(i + t) % names.length] as keyof typeof variants;
    const before = process.cpuUsage();
    await turn(variants[name], perTurn);
    const used = process.cpuUsage(before);
    cpu[name].push((used.user + used.system) / perTurn);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1] as number;
const best = (xs: number[]) => Math.min(...xs);
console.log(`Fastify inject, ${scenario}, ${turns} turns of ${perTurn} requests: CPU µs per request`);
for (const name of names) {
  const m = median(cpu[name]);
  console.log(
    `${name.padEnd(7)} median ${m.toFixed(1)}  best ${best(cpu[name]).toFixed(1)}  (+${(m - median(cpu.bare)).toFixed(1)} over bare)`,
  );
}
console.log(
  `otel over oncely: +${(median(cpu.otel) - median(cpu.oncely)).toFixed(1)} µs per request (median)`,
);
process.exit(0);
