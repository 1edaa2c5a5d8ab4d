// The engine's own cost per request, without HTTP: Idempotency.handle + Execution.complete on a MemoryStore, in
// one process, for a first execution (a new key each time) and a replay (100 warm keys). Counts what the
// adapters add on top of the framework minus the syscalls, so a change to the core can be measured in seconds
// and without autocannon's noise. `pnpm --filter @oncely/benchmarks micro [first|replay]` (on the packages' sources).
// OTEL=on adds `...otel()` from @oncely/opentelemetry, recording to an SDK MeterProvider whose exporter drops
// everything (no recording span, as with no tracer provider): what OpenTelemetry costs the engine per request.
import { Idempotency, type IdempotencyOptions, MemoryStore } from '@oncely/core';
import { otelOptions } from '../src/otel';

const BODY = {
  amount: 1999,
  currency: 'usd',
  customer: 'cus_NffrFeUfNV2Hib',
  description: 'Benchmark charge for order 000123',
};
// Each completion gets bytes of its own, as from an adapter (Buffer.from of the text sent), so the adapter's
// allocation is counted too. The MemoryStore copies every stored body either way (a short one into a shared slab).
const RESPONSE_TEXT = JSON.stringify({ id: 'ch_3MmlLrLkdIwHu7ix0snN0B15', object: 'charge', amount: 1999 });
const HEADERS = {
  'content-type': 'application/json; charset=utf-8',
  'content-length': String(Buffer.byteLength(RESPONSE_TEXT)),
};
const seconds = Number(process.env.SECONDS ?? 2);

const telemetry: IdempotencyOptions = process.env.OTEL === 'on' ? await otelOptions() : {};

async function run(name: string, keyOf: (i: number) => string): Promise<void> {
  const engine = new Idempotency({
    store: new MemoryStore(),
    ...(process.env.FP === 'off' ? { fingerprint: false as const } : {}),
    ...telemetry,
  });
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const once = async (i: number) => {
    headers['idempotency-key'] = keyOf(i);
    const decision = await engine.handle({
      method: 'POST',
      url: '/charges',
      headers,
      body: BODY,
      request: undefined,
    });
    if (decision.action === 'execute')
      await decision.execution.complete({ status: 201, headers: HEADERS, body: Buffer.from(RESPONSE_TEXT) });
    else if (decision.action !== 'respond' || decision.response.status !== 201)
      throw new Error(`unexpected ${decision.action}`);
  };
  // Warm up (JIT, and the LRU full at its 10,000 records as under load), then measure.
  for (let i = 0; i < 20_000; i++) await once(i);
  // Rounds of 0.2 s; the fastest says what the code costs, the median what this (shared, noisy) machine gave.
  let n = 20_000;
  const rounds: number[] = [];
  for (let r = 0; r < Math.max(1, Math.round(seconds * 5)); r++) {
    const start = process.hrtime.bigint();
    const end = start + 200_000_000n;
    let now = start;
    let ops = 0;
    while (now < end) {
      for (let j = 0; j < 1000; j++) await once(n++);
      ops += 1000;
      now = process.hrtime.bigint();
    }
    rounds.push(Number(now - start) / ops / 1000);
  }
  rounds.sort((x, y) => x - y);
  const best = rounds[0] as number;
  const median = rounds[rounds.length >> 1] as number;
  console.log(`${name.padEnd(8)} best ${best.toFixed(2)} µs/request, median ${median.toFixed(2)} µs`);
}

const which = process.argv[2] ?? 'all';
const run_id = Math.random().toString(36).slice(2);
if (which === 'all' || which === 'first') await run('first', (i) => `${run_id}-${i}`);
if (which === 'all' || which === 'replay') await run('replay', (i) => `warm-${i % 100}`);
