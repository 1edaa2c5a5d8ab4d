import { createServer } from 'node:http';
import { getRequestListener } from '@hono/node-server';
import {
  type AdapterHarness,
  expectedBinary,
  expectedWebStream,
  pipeParams,
  pipeWebSource,
  reusedBuffer,
  routeCounts,
  serveTestApp,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
  viewOptions,
} from '@oncely/testing';
import { idempotencyKeyOf, idempotencyOf, withIdempotency } from '../src';

const later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The suite's routes (see TestApp in @oncely/testing) as one fetch handler wrapped by withIdempotency. */
export function webHarness(name: string): AdapterHarness {
  const harness: NestableHarness = {
    name,
    nested: { rule: 'refused', create: (outer, inner) => harness.create(outer, inner) },
    // With `inner`, POST /charges is wrapped a second time (the suite's nested registrations).
    async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
      const { hit: count, count: counted } = routeCounts();
      const view = (request: Request) => ({ headers: Object.fromEntries(request.headers) });
      const routes = async (request: Request, wrapped = false): Promise<Response> => {
        const url = new URL(request.url);
        const delay = Number(url.searchParams.get('delay') ?? 0);
        const path = url.pathname;
        // Rebuilt on the way in, as a router or a Workers middleware does: the inner registration still meets
        // the outer one.
        if (nestedCharges !== undefined && !wrapped && path === '/charges' && request.method === 'POST')
          return nestedCharges(new Request(request));
        if (path === '/charges') {
          const n = count('charges');
          const text = await request.text();
          const body = text === '' ? {} : (JSON.parse(text) as { amount?: number });
          if (delay > 0) await later(delay);
          const headers = new Headers({ 'x-charge-id': String(n), 'set-cookie': `session=${n}` });
          const status = request.method === 'GET' || request.method === 'DELETE' ? 200 : 201;
          return Response.json({ id: n, amount: body.amount ?? null }, { status, headers });
        }
        if (path.startsWith('/status/')) {
          const n = count('status');
          const code = Number(path.slice('/status/'.length));
          if (delay > 0) await later(delay);
          return code === 204 ? new Response(null, { status: 204 }) : Response.json({ n }, { status: code });
        }
        if (path === '/throw') {
          count('throw');
          const status = url.searchParams.get('status');
          throw Object.assign(new Error('boom'), status ? { status: Number(status) } : {});
        }
        if (path === '/reject') {
          count('reject');
          await new Promise((resolve) => setImmediate(resolve));
          throw new Error('async boom');
        }
        if (path === '/binary') {
          count('binary');
          return new Response(expectedBinary(), { headers: { 'content-type': 'application/octet-stream' } });
        }
        if (path === '/stream') {
          count('stream');
          return new Response(expectedWebStream(), {
            headers: { 'content-type': 'application/octet-stream' },
          });
        }
        if (path === '/big') {
          count('big');
          return new Response('x'.repeat(Number(url.searchParams.get('size'))), {
            headers: { 'content-type': 'text/plain' },
          });
        }
        if (path === '/text') {
          count('text');
          return new Response('héllo wörld ✓', { headers: { 'content-type': 'text/plain; charset=utf-8' } });
        }
        if (path === '/key') return Response.json({ key: idempotencyKeyOf(request) ?? null });
        if (path === '/bad-status') {
          count('bad-status');
          // Undici's Response refuses a status outside 200-599 (a RangeError); @hono/node-server's takes it, and
          // Node would refuse it when writing the head.
          if (url.searchParams.get('in') === 'handler') return new Response('{}', { status: 1000 });
          throw new Error('no status');
        }
        if (path === '/pipe') {
          count('pipe');
          const { chunks, every, fail } = pipeParams(url.searchParams);
          return new Response(pipeWebSource(chunks, every, fail), {
            headers: { 'content-type': 'application/octet-stream' },
          });
        }
        if (path === '/reused') {
          count('reused');
          return new Response(reusedBuffer(), { headers: { 'content-type': 'application/octet-stream' } });
        }
        if (path === '/steps') {
          const answer = await stepsRoute(idempotencyOf(request), url.searchParams, count);
          return Response.json(answer.body, { status: answer.status });
        }
        return new Response('not found', { status: 404 });
      };
      const nestedCharges =
        inner === undefined
          ? undefined
          : withIdempotency((request: Request) => routes(request, true), viewOptions(inner, view));
      const handler = withIdempotency(
        routes,
        viewOptions(options, (request: Request) => ({ headers: Object.fromEntries(request.headers) })),
      );
      // The application's error handler, outside oncely: what a thrown error becomes.
      const app = async (request: Request): Promise<Response> => {
        try {
          return await handler(request);
        } catch (error) {
          const { message, status } = error as Error & { status?: number };
          // /bad-status: a hand-written error handler that answers a status no HTTP response can have.
          if (new URL(request.url).pathname === '/bad-status')
            return Response.json({ error: message }, { status: status ?? 1000 });
          return Response.json({ error: message }, { status: status ?? 500 });
        }
      };
      const server = createServer(getRequestListener(app));
      return serveTestApp(server, counted);
    },
  };
  return harness;
}

/** A harness whose `create` also takes the options of a second registration on POST /charges. */
type NestableHarness = AdapterHarness & {
  create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
};
