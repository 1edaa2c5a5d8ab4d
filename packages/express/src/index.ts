import {
  type CapturedResponse,
  type Execution,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type StoredResponse,
} from '@oncely/core';
import type { NextFunction, Request, RequestHandler, Response } from 'express';

declare global {
  namespace Express {
    interface Request {
      /** The Idempotency-Key this request runs under (unquoted), set while oncely covers the request. */
      idempotencyKey?: string;
      /** The key and, in transactional mode, the transaction's database client; set while oncely covers the request. */
      idempotency?: IdempotencyContext;
    }
  }
}

/** Options of the Express middleware: the shared options (contract §2); `scope` and `fingerprint` get the Express request. */
export type ExpressIdempotencyOptions = IdempotencyOptions<Request>;

// Symbol.for, so that two copies of this package in one app still see each other's state.
const kState = Symbol.for('oncely.express.state');
const kLayerPatched = Symbol.for('oncely.express.layerPatched');

interface RequestState {
  execution: Execution;
  error: unknown;
}
type StatefulRequest = Request & { [kState]?: RequestState };

/**
 * Express middleware (Express 4 and 5): `app.use(idempotency())` covers every POST/PUT/PATCH; on one route,
 * `app.post('/charges', idempotency({ required: true }), handler)`. Options are checked here, once.
 * When two oncely middlewares meet one request (app-wide and route-level), the first that takes it wins.
 */
export function idempotency(options: ExpressIdempotencyOptions = {}): RequestHandler {
  const engine = new Idempotency<Request>(options);
  const log = engine.options.logger;
  let warnedNoBody = false;

  return function idempotencyMiddleware(req: Request, res: Response, next: NextFunction): void {
    if ((req as StatefulRequest)[kState] !== undefined || !engine.covers(req.method)) {
      next();
      return;
    }
    if (
      !warnedNoBody &&
      req.body === undefined &&
      engine.options.fingerprint === undefined &&
      req.headers[engine.options.header] !== undefined &&
      ((req.headers['content-length'] ?? '0') !== '0' || req.headers['transfer-encoding'] !== undefined)
    ) {
      warnedNoBody = true;
      log?.warn(
        {},
        'oncely: the request body was not parsed, so the fingerprint ignores it; mount express.json() (or another body parser) before idempotency()',
      );
    }
    engine
      .handle({
        method: req.method,
        url: req.originalUrl,
        headers: req.headers,
        body: req.body,
        request: req,
      })
      .then((decision) => {
        // Something else (a timeout middleware, say) answered while the store was being asked: do nothing more,
        // and free the key if we hold it.
        if (res.headersSent || res.writableEnded) {
          if (decision.action === 'execute') void decision.execution.fail(new Error('response already sent'));
          return;
        }
        if (decision.action === 'pass') return next();
        if (decision.action === 'respond') return send(res, decision.response);
        const { execution } = decision;
        const state: RequestState = { execution, error: undefined };
        req.idempotencyKey = execution.clientKey;
        req.idempotency = { key: execution.clientKey, db: execution.db };
        (req as StatefulRequest)[kState] = state;
        patchLayer(req);
        capture(req as StatefulRequest, res, execution);
        // A response that closes without passing through our end (Express destroys the socket when a handler
        // fails after streaming began) would otherwise keep its lease renewed: release it if an error was noted.
        // Without an error the handler may still be running (the client merely left), so the lease stays.
        res.once('close', () => {
          if (state.error !== undefined) void execution.fail(state.error);
        });
        next();
      })
      .catch(next);
  };
}

export default idempotency;

function send(res: Response, response: StoredResponse): void {
  res.statusCode = response.status;
  for (const name in response.headers) res.setHeader(name, response.headers[name] as string | string[]);
  res.end(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

type WriteCallback = (error?: Error | null) => void;
// The two overloads of write/end this file calls; `.call` on the overloaded originals picks the wrong one.
type WriteFn = (this: Response, chunk: Buffer) => boolean;
type EndFn = (this: Response, cb: () => void) => Response;
type Chunk = string | Uint8Array;

function toBuffer(chunk: Chunk, encoding: unknown): Buffer {
  if (typeof chunk === 'string')
    return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

/**
 * Holds back what the handler writes — through res.json, res.send, res.write/res.end, writeHead or a pipe — until
 * the response has been stored, so that a client that got the response always finds it replayable. A body that
 * outgrows maxBodyBytes stops being held: it streams through, and the record keeps only its status (in
 * transactional mode all of it is held, since nothing may be sent before the commit).
 */
function capture(req: StatefulRequest, res: Response, execution: Execution): void {
  const write = res.write;
  const end = res.end;
  const writeHead = res.writeHead;
  const chunks: Buffer[] = [];
  const callbacks: WriteCallback[] = [];
  let size = 0;
  let passThrough = false;
  let ended = false;

  const restore = (): void => {
    res.write = write;
    res.end = end;
    res.writeHead = writeHead;
  };

  // Resolves to a response to send instead of the handler's (a failed transactional commit), if any.
  const settle = async (captured: CapturedResponse): Promise<StoredResponse | undefined> => {
    const state = req[kState];
    if (state?.error === undefined) return execution.complete(captured);
    await execution.fail(state.error);
    return undefined;
  };

  // Too big to keep: send what we hold and let the rest through untouched; `end` stays wrapped to settle.
  const startPassThrough = (): void => {
    passThrough = true;
    res.write = write;
    res.writeHead = writeHead;
    for (const chunk of chunks) (write as WriteFn).call(res, chunk);
    chunks.length = 0;
  };

  res.writeHead = function writeHeadCaptured(this: Response, status: number, ...rest: unknown[]) {
    this.statusCode = status;
    let headers = rest[0];
    if (typeof headers === 'string') {
      this.statusMessage = headers;
      headers = rest[1];
    }
    if (Array.isArray(headers)) {
      // Raw header list: [name, value, name, value, ...] or [[name, value], ...].
      const flat = Array.isArray(headers[0]) ? headers.flat() : headers;
      for (let i = 0; i + 1 < flat.length; i += 2) this.setHeader(String(flat[i]), flat[i + 1] as string);
    } else if (headers !== null && typeof headers === 'object') {
      for (const [name, value] of Object.entries(headers))
        if (value !== undefined) this.setHeader(name, value as string);
    }
    return this;
  } as Response['writeHead'];

  res.write = function writeCaptured(this: Response, chunk: Chunk, encoding?: unknown, cb?: unknown) {
    if (typeof encoding === 'function') cb = encoding;
    const buffer = toBuffer(chunk, encoding);
    chunks.push(buffer);
    size += buffer.byteLength;
    // The chunk is accepted into memory: say so now, or a handler awaiting its write callback would never resume.
    if (typeof cb === 'function') process.nextTick(cb as WriteCallback);
    if (size > execution.bufferLimit) startPassThrough();
    return true;
  } as Response['write'];

  res.end = function endCaptured(this: Response, chunk?: unknown, encoding?: unknown, cb?: unknown) {
    if (typeof chunk === 'function') {
      cb = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (ended) return this;
    ended = true;
    if (chunk !== undefined && chunk !== null) {
      const buffer = toBuffer(chunk as Chunk, encoding);
      chunks.push(buffer);
      size += buffer.byteLength;
    }
    if (typeof cb === 'function') callbacks.push(cb as WriteCallback);
    const done = (): void => {
      for (const callback of callbacks) callback();
    };
    if (size > execution.bufferLimit) {
      // Kept as executed with its status only (its replay is a 410); the body streams through now.
      if (!passThrough) startPassThrough();
      else for (const extra of chunks) (write as WriteFn).call(res, extra);
      res.end = end;
      const headers = res.getHeaders();
      (end as EndFn).call(res, done);
      void settle({ status: res.statusCode, headers, body: undefined });
      return this;
    }
    const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size);
    const stored = size <= execution.maxBodyBytes ? body : undefined;
    const status = res.statusCode;
    const headers = res.getHeaders();
    void settle({ status, headers, body: stored }).then((replacement) => {
      restore();
      if (replacement === undefined) {
        // While the store was asked, headersSent still read false: code running after the handler's answer (a
        // late error handler, say) may have changed status or headers. Send exactly what was stored.
        res.statusCode = status;
        for (const name of res.getHeaderNames()) if (!(name in headers)) res.removeHeader(name);
        for (const name in headers) res.setHeader(name, headers[name] as string | string[] | number);
        res.end(body, done);
        return;
      }
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      send(res, replacement);
      done();
    });
    return this;
  } as Response['end'];
}

interface LayerPrototype {
  handle_request?: LayerHandle;
  handleRequest?: LayerHandle;
  [kLayerPatched]?: true;
}
type LayerHandle = (this: unknown, req: Request, res: Response, next: NextFunction) => unknown;

/**
 * Express gives middleware no way to see an error that a later handler throws or passes to `next(err)`: the router
 * carries it straight to error handlers. To release the key on such an error, whatever status the app's error
 * handler then answers, we wrap the router's Layer request method once (Express 4: `handle_request`, Express 5:
 * `handleRequest`) so the `next` it hands each handler notes errors on requests oncely covers. Requests oncely
 * does not cover pass through untouched.
 */
function patchLayer(req: Request): void {
  const app = req.app as unknown as { _router?: { stack?: object[] }; router?: { stack?: object[] } };
  const stack = app._router?.stack ?? app.router?.stack;
  const layer = stack?.[0];
  if (layer === undefined) return;
  const proto = Object.getPrototypeOf(layer) as LayerPrototype;
  if (proto[kLayerPatched]) return;
  proto[kLayerPatched] = true;
  for (const method of ['handle_request', 'handleRequest'] as const) {
    const original = proto[method];
    if (typeof original !== 'function') continue;
    proto[method] = function handleRequestObserved(
      this: unknown,
      req: Request,
      res: Response,
      next: NextFunction,
    ) {
      const state = (req as StatefulRequest)[kState];
      if (state === undefined) return original.call(this, req, res, next);
      const observed = ((error?: unknown) => {
        if (
          error !== undefined &&
          error !== null &&
          error !== 'route' &&
          error !== 'router' &&
          state.error === undefined
        ) {
          state.error = error;
        }
        return next(error as Error);
      }) as NextFunction;
      return original.call(this, req, res, observed);
    };
  }
}
