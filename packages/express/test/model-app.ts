import { createServer } from 'node:http';
import { Readable } from 'node:stream';
import {
  delayOf,
  type ModelApp,
  type ModelAppFactory,
  type ModelRoute,
  modelOptions,
  nextChunk,
  type RunHandle,
  serveTestApp,
} from '@oncely/testing';
import express, { type Express, type NextFunction, type Request, type Response } from 'express';
import express4 from 'express4';
import { idempotency } from '../src';

type ExpressFactory = (() => Express) & {
  json: typeof import('express').json;
  text: typeof import('express').text;
};

/** The model app (see ModelRoute in @oncely/testing) on Express: `app.use(['/p', '/n'], idempotency())`, and one per route. */
export function expressModelApp(express: ExpressFactory): ModelAppFactory {
  return async (options): Promise<ModelApp> => {
    const { recorder } = options;
    const { appWide, perUser } = modelOptions<Request>(options, (req) => req.headers);
    const app = express();
    app.use(express.json());
    app.use(express.text());
    app.use(['/p', '/n'], idempotency(appWide));
    const user = idempotency(perUser);
    const begin = (route: ModelRoute, req: Request, res: Response): RunHandle => {
      const run = recorder.begin(
        route,
        req.headers,
        typeof req.body === 'string' ? req.body : JSON.stringify(req.body ?? null),
      );
      run.watch(res);
      res.set(run.headers());
      return run;
    };
    // After the request's delay, errors to `next` (Express 4 does not catch what an async handler throws).
    const after = (req: Request, next: NextFunction, send: () => void) => {
      const guarded = () => {
        try {
          send();
        } catch (error) {
          next(error);
        }
      };
      const delay = delayOf(req.headers);
      if (delay > 0) setTimeout(guarded, delay);
      else guarded();
    };
    const json = (route: ModelRoute, status: number) => (req: Request, res: Response, next: NextFunction) => {
      const run = begin(route, req, res);
      after(req, next, () => {
        const body = run.json();
        run.answer(status, 'application/json', body);
        res.status(status).type('application/json').send(body);
      });
    };
    app.post('/p/json', json('/p/json', 201));
    app.post('/p/text', (req, res, next) => {
      const run = begin('/p/text', req, res);
      after(req, next, () => {
        const body = run.text();
        run.answer(201, 'text/plain', body);
        res.status(201).type('text/plain').send(body.toString());
      });
    });
    app.post('/n/json', user, json('/n/json', 201));
    app.post('/u/json', user, json('/u/json', 201));
    app.post('/u/fail', user, json('/u/fail', 503));
    app.post('/u/teapot', user, json('/u/teapot', 418));
    app.post('/u/throw', user, (req, res) => {
      const run = begin('/u/throw', req, res);
      run.handed();
      throw new Error('the handler threw');
    });
    app.post('/u/reject', user, (req, res, next) => {
      const run = begin('/u/reject', req, res);
      setTimeout(() => {
        run.handed();
        next(new Error('the handler failed later'));
      }, delayOf(req.headers));
    });
    app.post('/u/bad-status', user, (req, res, next) => {
      const run = begin('/u/bad-status', req, res);
      after(req, next, () => {
        run.handed();
        // As an error handler copying `err.status` of an error that has none does.
        res.statusCode = (new Error('no status') as Error & { status?: number }).status as number;
        res.json({ error: 'no status' });
      });
    });
    app.post('/u/stream', user, (req, res, next) => {
      const run = begin('/u/stream', req, res);
      after(req, next, () => {
        const chunks = run.streamChunks();
        run.answer(200, 'application/octet-stream', Buffer.concat(chunks), true);
        res.status(200).type('application/octet-stream');
        const source = Readable.from(
          (async function* () {
            for (const chunk of chunks) {
              await nextChunk();
              yield chunk;
            }
            run.handed();
          })(),
        );
        source.on('close', () => run.handed());
        source.pipe(res);
      });
    });
    app.post('/u/buffer', user, (req, res, next) => {
      const run = begin('/u/buffer', req, res);
      after(req, next, () => {
        const buffer = run.fill(recorder.pool.take());
        run.answer(200, 'application/octet-stream', buffer);
        res.once('close', () => recorder.pool.give(buffer));
        res.status(200).type('application/octet-stream').end(buffer);
      });
    });
    app.use((err: Error & { status?: number }, _req: Request, res: Response, _next: NextFunction) => {
      res.status(err.status ?? 500).json({ error: err.message });
    });
    return serveTestApp(createServer(app), () => 0);
  };
}

export const express5ModelApp = expressModelApp(express);
export const express4ModelApp = expressModelApp(express4 as unknown as ExpressFactory);
