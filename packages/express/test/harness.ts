import { createServer } from 'node:http';
import {
  type AdapterHarness,
  pipeParams,
  pipeSource,
  reusedBuffer,
  routeCounts,
  serveTestApp,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
} from '@oncely/testing';
import type { Express, NextFunction, Request, Response } from 'express';
import { idempotency } from '../src';

type ExpressFactory = (() => Express) & {
  json: typeof import('express').json;
  text: typeof import('express').text;
};

function streamBytes(): Buffer {
  const body = Buffer.alloc(10_000);
  for (let i = 0; i < body.length; i++) body[i] = (i * 7) % 256;
  return body;
}

/** A harness whose `create` also takes the options of a route-level registration on POST /charges. */
type NestableHarness = AdapterHarness & {
  create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
};

/** The suite's routes (see TestApp in @oncely/testing), on Express. */
export function expressHarness(name: string, express: ExpressFactory): AdapterHarness {
  const harness: NestableHarness = {
    name,
    nested: { rule: 'refused', create: (outer, inner) => harness.create(outer, inner) },
    // With `inner`, POST /charges has a route-level middleware of its own too (the suite's nested registrations).
    async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
      const { hit: count, count: counted } = routeCounts();
      const app = express();
      app.use(express.json());
      app.use(idempotency(options));
      const charges = (req: Request, res: Response) => {
        const n = count('charges');
        const reply = () => {
          res.setHeader('x-charge-id', String(n));
          res.setHeader('set-cookie', `session=${n}`);
          res
            .status(req.method === 'GET' || req.method === 'DELETE' ? 200 : 201)
            .json({ id: n, amount: req.body?.amount ?? null });
        };
        const delay = Number(req.query.delay ?? 0);
        if (delay > 0) setTimeout(reply, delay);
        else reply();
      };
      if (inner !== undefined) app.post('/charges', idempotency(inner), charges);
      app.all('/charges', charges);
      app.post('/status/:code', (req, res) => {
        const n = count('status');
        const code = Number(req.params.code);
        const reply = () => (code === 204 ? res.status(204).end() : res.status(code).json({ n }));
        const delay = Number(req.query.delay ?? 0);
        if (delay > 0) setTimeout(reply, delay);
        else reply();
      });
      app.post('/throw', (req) => {
        count('throw');
        throw Object.assign(new Error('boom'), req.query.status ? { status: Number(req.query.status) } : {});
      });
      app.post('/reject', (_req, _res, next) => {
        count('reject');
        setImmediate(() => next(new Error('async boom')));
      });
      app.post('/binary', (_req, res) => {
        count('binary');
        const body = Buffer.alloc(1024);
        for (let i = 0; i < body.length; i++) body[i] = i % 256;
        res.type('application/octet-stream').send(body);
      });
      app.post('/stream', (_req, res) => {
        count('stream');
        res.setHeader('content-type', 'application/octet-stream');
        const body = streamBytes();
        let i = 0;
        const next = () => {
          if (i === 10) return void res.end();
          res.write(body.subarray(i * 1000, ++i * 1000));
          setImmediate(next);
        };
        next();
      });
      app.post('/big', (req, res) => {
        count('big');
        res.type('text/plain').send('x'.repeat(Number(req.query.size)));
      });
      app.post('/text', (_req, res) => {
        count('text');
        res.type('text/plain').send('héllo wörld ✓');
      });
      app.post('/key', (req, res) => {
        res.json({ key: req.idempotencyKey ?? null });
      });
      app.post(
        '/bad-status',
        (req: Request, res: Response) => {
          count('bad-status');
          // Express 4 takes it (and Node's end() then refuses it); Express 5's res.status() throws.
          if (req.query.in === 'handler') res.status(undefined as unknown as number).json({ ok: true });
          else throw new Error('no status');
        },
        // A hand-written error handler that trusts every error to carry a status.
        (err: Error & { status?: number }, _req: Request, res: Response, _next: NextFunction) => {
          res.statusCode = err.status as number;
          res.json({ error: err.message });
        },
      );
      app.post('/pipe', (req, res, next) => {
        count('pipe');
        const { chunks, every, fail } = pipeParams(req.query as Record<string, unknown>);
        res.setHeader('content-type', 'application/octet-stream');
        pipeSource(chunks, every, fail).once('error', next).pipe(res);
      });
      app.post('/reused', (_req, res) => {
        count('reused');
        res.type('application/octet-stream').send(reusedBuffer());
      });
      app.post('/steps', (req, res, next) => {
        stepsRoute(req.idempotency, req.query, count).then(
          (answer) => res.status(answer.status).json(answer.body),
          next,
        );
      });
      // Errors the app's error handler answers with a 4xx (/throw?status=400) release the key only when oncely sees
      // them, as docs/frameworks/express.md tells users.
      app.use(idempotency.errors());
      app.use((err: Error & { status?: number }, _req: Request, res: Response, next: NextFunction) => {
        // Part of the answer was sent: Express's own handler then closes the connection.
        if (res.headersSent) return next(err);
        res.status(err.status ?? 500).json({ error: err.message });
      });
      return serveTestApp(createServer(app), counted);
    },
  };
  return harness;
}
