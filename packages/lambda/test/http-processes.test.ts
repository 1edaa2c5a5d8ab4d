/**
 * @services redis
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { IdempotencyStore } from '@oncely/core';
import { type SourceProcess, spawnSource } from '@oncely/testing';
import type { APIGatewayProxyEventV2, APIGatewayProxyStructuredResultV2 } from 'aws-lambda';
import { withIdempotency } from '../src';
import { lambdaContext, v2Event } from './http-events';
import { STORES, useStores } from './http-stores';

// Lambda processes of their own (tsx), on the real Redis and on dynalite: duplicates from several processes at
// once, Middy (ESM-only, so run there), and an invocation killed past its deadline.
jest.setTimeout(120_000);

const INVOKER = join(__dirname, 'fixtures', 'http-invoker.ts');
const later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

type Line = { ran?: string; deadline?: number; result?: APIGatewayProxyStructuredResultV2; error?: string };

function storeEnv(described: Record<string, string>): Record<string, string> {
  return described.kind === 'redis'
    ? { STORE_KIND: 'redis', REDIS_URL: described.url as string, PREFIX: described.prefix as string }
    : {
        STORE_KIND: 'dynamodb',
        DYNAMODB_ENDPOINT: described.endpoint as string,
        TABLE: described.table as string,
      };
}

/**
 * Starts an invoker; `lines` collects what it prints, `ready` resolves once it waits at its START_GATE, `done` at
 * its exit.
 */
function invoker(env: Record<string, string>): {
  process: SourceProcess;
  lines: Line[];
  ready: Promise<void>;
  done: Promise<void>;
} {
  const process = spawnSource(INVOKER, env);
  const lines: Line[] = [];
  let onReady = () => {};
  const ready = new Promise<void>((resolve) => {
    onReady = resolve;
  });
  process.lines.on('line', (line) => {
    const said = JSON.parse(line) as Line & { ready?: true };
    if (said.ready) onReady();
    else lines.push(said);
  });
  // One that exits before it is ready (a crash) must not hold the others at the gate.
  const done = new Promise<void>((resolve) =>
    process.child.once('exit', () => {
      onReady();
      resolve();
    }),
  );
  return { process, lines, ready, done };
}

describe.each(STORES)('Lambda processes on %s', (_name, makeStores) => {
  let store: IdempotencyStore;
  const stores = useStores(makeStores, (s) => {
    store = s;
  });
  const started: SourceProcess[] = [];
  afterAll(() => Promise.all(started.map((p) => p.kill())));
  const start = (env: Record<string, string>) => {
    const run = invoker({ ...storeEnv(stores.describe(store)), ...env });
    started.push(run.process);
    return run;
  };

  test('Middy: replay from before, 422 for another body, a throw releases the key', async () => {
    const event = (key: string, body: string) => v2Event({ headers: { 'idempotency-key': key }, body });
    const run = start({
      MODE: 'middy',
      EVENTS: JSON.stringify([
        event('m1', 'x'),
        event('m1', 'x'),
        event('m1', 'y'),
        event('m2', 'throw-once'),
        event('m2', 'throw-once'),
      ]),
    });
    await run.done;
    const results = run.lines.filter((l) => l.ran === undefined);
    expect(run.lines.filter((l) => l.ran !== undefined).map((l) => l.ran)).toEqual(['m1', 'm2', 'm2']);
    const [first, replay, reused, thrown, retried] = results;
    expect(first?.result).toMatchObject({ statusCode: 201, cookies: ['session=1'] });
    expect(replay?.result).toMatchObject({
      statusCode: 201,
      body: first?.result?.body,
      headers: { 'x-run': first?.result?.headers?.['x-run'], 'idempotent-replayed': 'true' },
    });
    expect(replay?.result?.cookies).toBeUndefined();
    expect(reused?.result?.statusCode).toBe(422);
    expect(thrown?.error).toBe('boom');
    expect(retried?.result?.statusCode).toBe(201);
  });

  test('duplicates from 6 processes at once (wrapper and Middy): one run per key, the rest a replay or a 409', async () => {
    const keys = ['d1', 'd2', 'd3', 'd4'];
    const events = keys.map((key) => v2Event({ headers: { 'idempotency-key': key }, body: key }));
    // All six start once every one has loaded, however long that took on a loaded machine.
    const gate = join(mkdtempSync(join(tmpdir(), 'oncely-lambda-')), 'go');
    const runs = Array.from({ length: 6 }, (_, i) =>
      start({
        MODE: i % 2 === 0 ? 'wrap' : 'middy',
        DELAY_MS: '300',
        START_GATE: gate,
        EVENTS: JSON.stringify(events),
      }),
    );
    await Promise.all(runs.map((r) => r.ready));
    writeFileSync(gate, '');
    await Promise.all(runs.map((r) => r.done));
    rmSync(dirname(gate), { recursive: true, force: true });
    const lines = runs.flatMap((r) => r.lines);
    const ran = lines.filter((l) => l.ran !== undefined).map((l) => l.ran);
    // Exactly one execution per key across all processes.
    expect(ran.sort()).toEqual(keys);
    const results = lines.filter((l) => l.ran === undefined);
    expect(results).toHaveLength(6 * keys.length);
    const originals = new Map<string, string>();
    for (const { result } of results) {
      if (result?.statusCode === 201 && result.headers?.['idempotent-replayed'] === undefined)
        originals.set(result.body?.split(' ')[0] ?? '', result.body as string);
    }
    for (const { result, error } of results) {
      expect(error).toBeUndefined();
      expect([201, 409]).toContain(result?.statusCode);
    }
    expect(results.filter((l) => l.result?.statusCode === 201)).not.toHaveLength(0);
    // Each replay carries the body of the one run of its key.
    const bodies = new Set(results.filter((l) => l.result?.statusCode === 201).map((l) => l.result?.body));
    expect(bodies.size).toBe(keys.length);
  });

  test('an invocation killed past its deadline: the retry takes over once the remaining time passed', async () => {
    const event = () => v2Event({ headers: { 'idempotency-key': 'k1' }, body: 'x' });
    const remainingMs = 1500;
    const killed = start({
      MODE: 'wrap',
      DELAY_MS: '60000',
      REMAINING_MS: String(remainingMs),
      LEASE_MARGIN: '200ms',
      EVENTS: JSON.stringify([event()]),
    });
    // It says its deadline as its handler starts.
    const deadline = await new Promise<number>((resolve) =>
      killed.process.lines.on('line', (line) => {
        const said = JSON.parse(line) as Line;
        if (said.ran !== undefined && said.deadline !== undefined) resolve(said.deadline);
      }),
    );
    await killed.process.kill();
    let runs = 0;
    const retry = withIdempotency(
      async () => {
        runs++;
        return { statusCode: 201, body: 'retry' };
      },
      { store, scope: false },
    );
    // Retried until it runs: every answer given within the dead invocation's time is a 409 (the key is still
    // held, no second run beside it), and it runs long before lockTimeout (30 s by default) would have passed.
    const giveUpAt = deadline + 200 + 10_000;
    let late: APIGatewayProxyStructuredResultV2;
    for (;;) {
      late = (await retry(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
      const answeredAt = Date.now();
      if (answeredAt < deadline) expect(late.statusCode).toBe(409);
      if (late.statusCode !== 409 || answeredAt > giveUpAt) break;
      await later(100);
    }
    expect(late).toMatchObject({ statusCode: 201, body: 'retry' });
    expect(runs).toBe(1);
  });

  test('a timed-out invocation that wakes after the retry took over is fenced: the retry stays stored', async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const fenced: unknown[] = [];
    const handler = withIdempotency(
      async (event: APIGatewayProxyEventV2) => {
        if (event.body === 'stale') await gate;
        return { statusCode: 201, body: event.requestContext.requestId };
      },
      { store, scope: false, leaseMargin: '100ms', hooks: { onFenced: (e) => void fenced.push(e) } },
    );
    // The same request (key and body); the request ids tell the two invocations apart.
    const event = () => v2Event({ headers: { 'idempotency-key': 'f1' }, body: 'stale' });
    const staleEvent = event();
    const stale = handler(staleEvent, lambdaContext(1000));
    await later(1000 + 100 + 1200);
    const retryEvent = event();
    // The retry as another process's Lambda would run it: the same request, a handler that does not hang.
    const retried = withIdempotency(
      async () => ({ statusCode: 201, body: retryEvent.requestContext.requestId }),
      {
        store,
        scope: false,
      },
    );
    expect(await retried(retryEvent, lambdaContext())).toMatchObject({
      statusCode: 201,
      body: retryEvent.requestContext.requestId,
    });
    release();
    // The stale one returns its own result to its (long gone) caller, but its write is refused.
    expect(await stale).toMatchObject({ statusCode: 201, body: staleEvent.requestContext.requestId });
    expect(fenced).toEqual([expect.objectContaining({ key: 'f1', operation: 'complete' })]);
    const replay = (await handler(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(replay).toMatchObject({
      statusCode: 201,
      body: retryEvent.requestContext.requestId,
      headers: { 'idempotent-replayed': 'true' },
    });
  });
});
