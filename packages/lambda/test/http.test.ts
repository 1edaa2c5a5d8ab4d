/**
 * @services redis
 */
import { currentIdempotency, type IdempotencyStore } from '@oncely/core';
import type {
  ALBEvent,
  ALBResult,
  APIGatewayProxyEvent,
  APIGatewayProxyEventV2,
  APIGatewayProxyResult,
  APIGatewayProxyStructuredResultV2,
} from 'aws-lambda';
import { idempotencyOf, withIdempotency } from '../src';
import { albEvent, lambdaContext, v1Event, v2Event } from './http-events';
import { STORES, useStores } from './http-stores';

const later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const json = (body: string | undefined) => JSON.parse(body ?? 'null') as Record<string, unknown>;

describe.each(STORES)('withIdempotency on %s', (_name, makeStores) => {
  let store: IdempotencyStore;
  useStores(makeStores, (s) => {
    store = s;
  });

  test('HTTP API (payload 2.0): the first call runs, a retry replays status, headers and body, never cookies', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async (event: APIGatewayProxyEventV2): Promise<APIGatewayProxyStructuredResultV2> => {
        runs++;
        return {
          statusCode: 201,
          headers: { 'content-type': 'application/json', 'x-charge-id': String(runs), 'Set-Cookie': 'a=1' },
          cookies: [`session=${runs}`],
          body: JSON.stringify({ id: runs, amount: json(event.body).amount }),
        };
      },
      { store, scope: false },
    );
    const event = () =>
      v2Event({
        headers: { 'Idempotency-Key': 'k1', 'content-type': 'application/json' },
        body: '{"amount":5}',
      });
    const first = (await handler(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(first.cookies).toEqual(['session=1']);
    const again = (await handler(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(runs).toBe(1);
    expect(again.statusCode).toBe(201);
    expect(json(again.body)).toEqual({ id: 1, amount: 5 });
    expect(again.headers).toMatchObject({
      'content-type': 'application/json',
      'x-charge-id': '1',
      'idempotent-replayed': 'true',
    });
    expect(again.cookies).toBeUndefined();
    expect(JSON.stringify(again)).not.toContain('session=');
    expect(JSON.stringify(again)).not.toMatch(/a=1|set-cookie/i);
    expect(again.isBase64Encoded).toBe(false);
  });

  test('Function URL (2.0 shape): a plain object result is a 200 of JSON, replayed as such', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return { ok: true, run: runs };
      },
      { store, scope: false },
    );
    const event = () => {
      const e = v2Event({ headers: { 'idempotency-key': 'url-1' }, body: 'x' });
      e.requestContext.domainName = 'abc.lambda-url.us-east-1.on.aws';
      return e;
    };
    expect(await handler(event(), lambdaContext())).toEqual({ ok: true, run: 1 });
    const again = (await handler(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(runs).toBe(1);
    expect(again).toMatchObject({
      statusCode: 200,
      body: '{"ok":true,"run":1}',
      headers: { 'content-type': 'application/json', 'idempotent-replayed': 'true' },
    });
    // A string result is its own body.
    const text = withIdempotency(async () => 'hello', { store, scope: false });
    const e = () => v2Event({ headers: { 'idempotency-key': 'url-2' } });
    expect(await text(e(), lambdaContext())).toBe('hello');
    expect(await text(e(), lambdaContext())).toMatchObject({ statusCode: 200, body: 'hello' });
  });

  test('REST API (payload 1.0): multi-value headers and a base64 body are replayed byte for byte; Set-Cookie never', async () => {
    let runs = 0;
    const binary = Buffer.from([0, 1, 2, 250, 251, 255, 10, 13]);
    const handler = withIdempotency(
      async (_event: APIGatewayProxyEvent): Promise<APIGatewayProxyResult> => {
        runs++;
        return {
          statusCode: 200,
          headers: { 'Content-Type': 'application/octet-stream', 'Set-Cookie': 'one=1' },
          multiValueHeaders: { 'X-Tag': ['a', 'b'], 'set-cookie': ['two=2', 'three=3'] },
          body: binary.toString('base64'),
          isBase64Encoded: true,
        };
      },
      { store, scope: false },
    );
    // The key header in multiValueHeaders only, in another case: still found.
    const event = () => {
      const e = v1Event({ body: 'abc' });
      e.multiValueHeaders = { 'IDEMPOTENCY-KEY': ['rest-1'] };
      e.headers = {};
      return e;
    };
    await handler(event(), lambdaContext());
    const again = (await handler(event(), lambdaContext())) as APIGatewayProxyResult;
    expect(runs).toBe(1);
    expect(again.statusCode).toBe(200);
    expect(again.isBase64Encoded).toBe(true);
    expect(Buffer.from(again.body, 'base64').equals(binary)).toBe(true);
    expect(again.multiValueHeaders).toEqual({ 'x-tag': ['a', 'b'] });
    expect(again.headers).toMatchObject({
      'content-type': 'application/octet-stream',
      'idempotent-replayed': 'true',
    });
    expect(JSON.stringify(again)).not.toMatch(/set-cookie|one=1|two=2|three=3|x-oncely/i);
  });

  test('ALB: the replay has statusDescription, and multiValueHeaders when the request came with them', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async (): Promise<ALBResult> => {
        runs++;
        return {
          statusCode: 202,
          statusDescription: '202 Accepted',
          multiValueHeaders: { 'x-tag': ['a', 'b'], 'content-type': ['text/plain'] },
          body: `run ${runs}`,
          isBase64Encoded: false,
        };
      },
      { store, scope: false },
    );
    const multi = () => albEvent({ headers: { 'Idempotency-Key': 'alb-1' }, body: 'x' }, true);
    await handler(multi(), lambdaContext());
    const again = (await handler(multi(), lambdaContext())) as ALBResult;
    expect(runs).toBe(1);
    expect(again).toMatchObject({
      statusCode: 202,
      statusDescription: '202 Accepted',
      body: 'run 1',
      isBase64Encoded: false,
      multiValueHeaders: {
        'x-tag': ['a', 'b'],
        'content-type': ['text/plain'],
        'idempotent-replayed': ['true'],
      },
    });
    expect(again.headers).toBeUndefined();
    // Without multi-value headers on the target group: one value per name.
    const single = () => albEvent({ headers: { 'Idempotency-Key': 'alb-1' }, body: 'x' }, false);
    const plain = (await handler(single(), lambdaContext())) as ALBResult;
    expect(runs).toBe(1);
    expect(plain.multiValueHeaders).toBeUndefined();
    expect(plain.headers).toMatchObject({ 'x-tag': 'a, b', 'idempotent-replayed': 'true' });
  });

  test('problem answers in each format: 400 without a key when required, 422 for another body, 409 while running', async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let runs = 0;
    const handler = withIdempotency(
      async (_event: ALBEvent | APIGatewayProxyEvent | APIGatewayProxyEventV2) => {
        runs++;
        await gate;
        return { statusCode: 201, body: 'done' };
      },
      { store, scope: false, required: true },
    );
    const missing = (await handler(albEvent({ body: 'x' }, true), lambdaContext())) as ALBResult;
    expect(missing).toMatchObject({
      statusCode: 400,
      statusDescription: '400 Bad Request',
      multiValueHeaders: { 'content-type': ['application/problem+json'] },
    });
    expect(json(missing.body).type).toBe('https://oncely.dev/problems/key-missing');

    const running = handler(v2Event({ headers: { 'idempotency-key': 'p1' }, body: 'one' }), lambdaContext());
    await later(200);
    const conflict = (await handler(
      v2Event({ headers: { 'idempotency-key': 'p1' }, body: 'one' }),
      lambdaContext(),
    )) as APIGatewayProxyStructuredResultV2;
    expect(conflict.statusCode).toBe(409);
    expect(conflict.headers?.['content-type']).toBe('application/problem+json');
    release();
    await running;
    const reused = (await handler(
      v1Event({ headers: { 'Idempotency-Key': 'p1' }, body: 'two' }),
      lambdaContext(),
    )) as APIGatewayProxyResult;
    expect(reused.statusCode).toBe(422);
    expect(json(reused.body).type).toBe('https://oncely.dev/problems/key-reused');
    // The key sent twice (multiValueHeaders): refused, not one of them picked.
    const twice = v1Event({ headers: { 'Idempotency-Key': ['p2', 'p3'] }, body: 'x' });
    expect(((await handler(twice, lambdaContext())) as APIGatewayProxyResult).statusCode).toBe(400);
    expect(runs).toBe(1);
  });

  test('the fingerprint reads the body decoded: the same bytes base64-encoded replay, other bytes are a 422', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return { statusCode: 201, body: String(runs) };
      },
      { store, scope: false },
    );
    const headers = { 'Idempotency-Key': 'b64', 'content-type': 'application/json' };
    await handler(v1Event({ headers, body: '{"a":1,"b":2}' }), lambdaContext());
    const sameBytes = (await handler(
      v1Event({ headers, body: '{"b":2,"a":1}', base64: true }),
      lambdaContext(),
    )) as APIGatewayProxyResult;
    expect(sameBytes).toMatchObject({ statusCode: 201, body: '1' });
    const other = (await handler(
      v1Event({ headers, body: '{"a":2}', base64: true }),
      lambdaContext(),
    )) as APIGatewayProxyResult;
    expect(other.statusCode).toBe(422);
    // Query and path are part of it too.
    const query = (await handler(
      v1Event({ headers, body: '{"a":1,"b":2}', query: { x: '1' } }),
      lambdaContext(),
    )) as APIGatewayProxyResult;
    expect(query.statusCode).toBe(422);
    expect(runs).toBe(1);
  });

  test('inProgress wait: a duplicate waits for the first and gets its replay', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        await later(300);
        return { statusCode: 200, body: `run ${runs}` };
      },
      { store, scope: false, inProgress: { wait: '10s' } },
    );
    const event = () => v2Event({ headers: { 'idempotency-key': 'w1' } });
    const [a, b] = (await Promise.all([
      handler(event(), lambdaContext()),
      later(50).then(() => handler(event(), lambdaContext())),
    ])) as APIGatewayProxyStructuredResultV2[];
    expect(runs).toBe(1);
    expect(a?.body).toBe('run 1');
    expect(b).toMatchObject({ statusCode: 200, body: 'run 1', headers: { 'idempotent-replayed': 'true' } });
  });

  test('a handler that throws: the error reaches Lambda, the key is released and a retry runs', async () => {
    let runs = 0;
    const warned: unknown[] = [];
    const logger = {
      debug: () => undefined,
      info: () => undefined,
      warn: (fields: unknown) => warned.push(fields),
      error: () => undefined,
    };
    const handler = withIdempotency(
      async () => {
        runs++;
        if (runs === 1) throw new Error('boom');
        return { statusCode: 201, body: 'ok' };
      },
      { store, scope: false, logger },
    );
    const event = () => v2Event({ headers: { 'idempotency-key': 't1' } });
    await expect(handler(event(), lambdaContext())).rejects.toThrow('boom');
    expect(warned.length).toBeGreaterThan(0);
    expect(await handler(event(), lambdaContext())).toMatchObject({ statusCode: 201, body: 'ok' });
    expect(runs).toBe(2);
  });

  test('a result API Gateway cannot send (1.0 without statusCode) is not stored: the key is released', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return runs === 1
          ? ({ body: 'no status' } as unknown as APIGatewayProxyResult)
          : { statusCode: 200, body: 'ok' };
      },
      { store, scope: false },
    );
    const event = () => v1Event({ headers: { 'Idempotency-Key': 'm1' } });
    expect(await handler(event(), lambdaContext())).toEqual({ body: 'no status' });
    expect(await handler(event(), lambdaContext())).toEqual({ statusCode: 200, body: 'ok' });
    expect(runs).toBe(2);
  });

  test('the handler reads its key: idempotencyOf(event) and currentIdempotency(), with step() and keyFor()', async () => {
    const seen: unknown[] = [];
    let effects = 0;
    const handler = withIdempotency(
      async (event: APIGatewayProxyEventV2) => {
        await later(1);
        const context = idempotencyOf(event);
        seen.push(context?.key, currentIdempotency() === context, context?.keyFor('provider').length);
        await context?.step('charge', async () => {
          effects++;
        });
        return { statusCode: 500, body: 'released, so a retry runs again' };
      },
      { store, scope: false },
    );
    const event = () => v2Event({ headers: { 'idempotency-key': 'ctx-1' } });
    await handler(event(), lambdaContext());
    await handler(event(), lambdaContext());
    expect(seen).toEqual(['ctx-1', true, 43, 'ctx-1', true, 43]);
    // The step ran once although the handler ran twice.
    expect(effects).toBe(1);
    expect(idempotencyOf(event())).toBeUndefined();
  });

  test('the lease ends with the invocation, unless lockTimeout is set: then a duplicate still meets a 409', async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const hang = async () => {
      await gate;
      return { statusCode: 201, body: 'late' };
    };
    const event = (key: string) => v2Event({ headers: { 'idempotency-key': key } });
    const byDeadline = withIdempotency(hang, { store, scope: false, leaseMargin: '100ms' });
    const byLockTimeout = withIdempotency(hang, { store, scope: false, lockTimeout: '30s' });
    const first = [
      byDeadline(event('l1'), lambdaContext(200)),
      byLockTimeout(event('l2'), lambdaContext(200)),
    ];
    // Past both deadlines (and the one-second floor of an acquired lease).
    await later(2000);
    const quick = withIdempotency(async () => ({ statusCode: 200, body: 'retry' }), { store, scope: false });
    expect(await quick(event('l1'), lambdaContext())).toMatchObject({ statusCode: 200, body: 'retry' });
    expect(await quick(event('l2'), lambdaContext())).toMatchObject({ statusCode: 409 });
    release();
    await Promise.all(first);
  });

  test('scope gets the event: the same key under two scopes names two records', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return { statusCode: 200, body: String(runs) };
      },
      { store, scope: (event: APIGatewayProxyEventV2) => event.headers['x-tenant'] ?? 'none' },
    );
    const event = (tenant: string) => v2Event({ headers: { 'idempotency-key': 's1', 'x-tenant': tenant } });
    await handler(event('a'), lambdaContext());
    await handler(event('b'), lambdaContext());
    expect(await handler(event('a'), lambdaContext())).toMatchObject({ body: '1' });
    expect(runs).toBe(2);
  });
});

describe('withIdempotency without a store call', () => {
  test('an event that is not an HTTP event is refused with an error that names the fix', async () => {
    const handler = withIdempotency(async () => ({ statusCode: 200 }), { scope: false });
    await expect(
      handler({ Records: [] } as unknown as APIGatewayProxyEventV2, lambdaContext()),
    ).rejects.toThrow(/idempotentBatch/);
  });

  test('options are checked once, naming the option', () => {
    expect(() =>
      withIdempotency(async () => ({ statusCode: 200 }), { leaseMargin: 'soon' as never }),
    ).toThrow(/leaseMargin/);
    expect(() => withIdempotency(async () => ({ statusCode: 200 }), { lockTimout: '1s' } as never)).toThrow(
      /lockTimout/,
    );
  });

  test('requests without a key, and GETs, pass through untouched', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return { statusCode: 200, body: 'x' };
      },
      { scope: false },
    );
    await handler(v2Event({}), lambdaContext());
    await handler(v2Event({}), lambdaContext());
    await handler(v2Event({ method: 'GET', headers: { 'idempotency-key': 'g' } }), lambdaContext());
    await handler(v2Event({ method: 'GET', headers: { 'idempotency-key': 'g' } }), lambdaContext());
    expect(runs).toBe(4);
  });
});
