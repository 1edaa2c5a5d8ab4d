/**
 * @services redis
 */
// Middy is ESM-only, which jest cannot load: its middleware is tested in processes (http-processes.test.ts).
import { Router } from '@aws-lambda-powertools/event-handler/http';
import { currentIdempotency, type IdempotencyStore } from '@oncely/core';
import type { APIGatewayProxyEventV2, APIGatewayProxyStructuredResultV2, Context } from 'aws-lambda';
import { idempotencyOf, routerIdempotency } from '../src';
import { albEvent, lambdaContext, v1Event, v2Event } from './http-events';
import { STORES, useStores } from './http-stores';

const _later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe.each(STORES)('the Powertools HTTP router on %s', (_name, makeStores) => {
  let store: IdempotencyStore;
  useStores(makeStores, (s) => {
    store = s;
  });

  test('Powertools router: one run per key on every event type, the replay with its headers, Set-Cookie never', async () => {
    let runs = 0;
    const seen: unknown[] = [];
    const app = new Router();
    app.use(routerIdempotency({ store, scope: false }));
    app.post('/charges', async (reqCtx) => {
      runs++;
      seen.push(currentIdempotency()?.key === idempotencyOf(reqCtx.event)?.key);
      const body = (await reqCtx.req.json()) as { amount: number };
      return new Response(JSON.stringify({ id: runs, amount: body.amount }), {
        status: 201,
        headers: { 'content-type': 'application/json', 'x-run': String(runs), 'set-cookie': 'sid=1' },
      });
    });
    const handler = (event: unknown, context: Context) =>
      app.resolve(event as APIGatewayProxyEventV2, context) as Promise<Record<string, unknown>>;
    const input = (key: string, amount: number) => ({
      headers: { 'Idempotency-Key': key, 'content-type': 'application/json' },
      body: JSON.stringify({ amount }),
    });

    for (const [i, make] of [
      v2Event,
      v1Event,
      (x: Parameters<typeof v1Event>[0]) => albEvent(x, true),
    ].entries()) {
      const key = `r-${i}`;
      const first = await handler(make(input(key, 5)), lambdaContext());
      expect(first.statusCode).toBe(201);
      const again = await handler(make(input(key, 5)), lambdaContext());
      expect(again.statusCode).toBe(201);
      expect(JSON.parse(again.body as string)).toEqual({ id: i + 1, amount: 5 });
      expect(JSON.stringify(again)).toMatch(/idempotent-replayed/i);
      expect(JSON.stringify(again)).not.toMatch(/sid=1/);
      const reused = await handler(make(input(key, 6)), lambdaContext());
      expect(reused.statusCode).toBe(422);
    }
    expect(runs).toBe(3);
    expect(seen).toEqual([true, true, true]);
  });

  test('Powertools router: a route that throws releases the key; the router answers its error', async () => {
    let runs = 0;
    const app = new Router();
    app.post('/charges', [routerIdempotency({ store, scope: false, required: true })], async () => {
      runs++;
      if (runs === 1) throw new Error('boom');
      return { ok: runs };
    });
    const event = () => v2Event({ headers: { 'idempotency-key': 't1' }, body: 'x' });
    const first = (await app.resolve(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(first.statusCode).toBe(500);
    const second = (await app.resolve(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(second.statusCode).toBe(200);
    expect(runs).toBe(2);
    const missing = (await app.resolve(
      v2Event({ body: 'x' }),
      lambdaContext(),
    )) as APIGatewayProxyStructuredResultV2;
    expect(missing.statusCode).toBe(400);
    expect(runs).toBe(2);
  });
});
