import { IncomingMessage, ServerResponse } from 'node:http';
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
const kStates = Symbol.for('oncely.express.states');
const kLayerPatched = Symbol.for('oncely.express.layerPatched');

interface RequestState {
  execution: Execution;
  /** An error a later handler passed on (seen through the patched Layer): the key is released. */
  error: unknown;
  /** The response's capture while it holds the body back; `undefined` once the response went its own way. */
  capture: Capture | undefined;
  /** `req.idempotency`, made on first read. */
  context: IdempotencyContext | undefined;
}

/**
 * Covered requests, keyed by request, shared across copies of this package. oncely adds nothing to a covered
 * request or response object: Express replaces the prototype of each (`Object.setPrototypeOf`), after which V8
 * caches no transitions for them, so every property added, or prototype replaced, costs ~1-1.5 µs and leaves a
 * garbage hidden class behind. The six properties oncely used to add (three on `req`; `write`, `end`, `writeHead`
 * on `res`) were ~9 µs of a ~42 µs first-execution overhead (benchmarks/notes.md). Instead, `req.idempotencyKey`,
 * `req.idempotency` and the capture of `res.write`/`res.end`/`res.writeHead` live once on Express's own request
 * and response prototypes (`express.request`/`express.response`, the documented place to extend them), and look
 * their request up here.
 */
const globalStates = globalThis as typeof globalThis & { [kStates]?: WeakMap<Response, RequestState> };
// Keyed by the response, which the hot paths (write, end, the Layer wrapper) hold without reading a property.
globalStates[kStates] ??= new WeakMap<Response, RequestState>();
const states = globalStates[kStates];

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
    if (states.has(res) || !engine.covers(req.method)) {
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
        // (headersSent alone: an ended response has sent its headers. Each property read on an Express response
        // is slow, see `states`.)
        if (res.headersSent) {
          if (decision.action === 'execute') void decision.execution.fail(new Error('response already sent'));
          return;
        }
        if (decision.action === 'pass') return next();
        if (decision.action === 'respond') return send(res, decision.response);
        const { execution } = decision;
        const state: RequestState = { execution, error: undefined, context: undefined, capture: undefined };
        states.set(res, state);
        if (!extendRequestBase(req)) {
          // Not Express's request (no express.request in its chain): plain properties, then.
          req.idempotencyKey = execution.clientKey;
          req.idempotency = { key: execution.clientKey, db: execution.db };
        }
        patchLayer(req);
        state.capture = new Capture(res, state);
        // A response that closes without passing through our end: Express destroys the socket when a handler fails
        // after streaming began (release the noted error), or something sent it around oncely (a method replaced
        // after oncely ran): recorded as executed without a body. Without either, the handler may still be
        // running (the client merely left): the lease stays.
        res.on('close', () => {
          if (state.error !== undefined) void execution.fail(state.error);
          else if (res.writableFinished && state.capture?.ended === false)
            void execution.complete({ status: res.statusCode, headers: res.getHeaders(), body: undefined });
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
type Chunk = string | Uint8Array;
type Method = 'write' | 'end' | 'writeHead';
type AnyMethod = (this: Response, ...args: unknown[]) => unknown;
const METHODS: readonly Method[] = ['write', 'end', 'writeHead'];

function toBuffer(chunk: Chunk, encoding: unknown): Buffer {
  if (typeof chunk === 'string')
    return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

const kExtended = Symbol.for('oncely.express.extended');
type Extensible = Record<PropertyKey, unknown>;

/**
 * The object in `value`'s prototype chain that sits right on `node` (Node's `IncomingMessage.prototype` or
 * `ServerResponse.prototype`): Express's `request`/`response`, the base of every app's and sub-app's prototypes.
 * Looked up once per prototype met.
 */
const bases = new WeakMap<object, Extensible | null>();
function baseOf(value: object, node: object): Extensible | undefined {
  const proto = Object.getPrototypeOf(value) as object | null;
  if (proto === null) return undefined;
  let base = bases.get(proto);
  if (base === undefined) {
    base = null;
    for (
      let p: object | null = proto;
      p !== null && p !== node;
      p = Object.getPrototypeOf(p) as object | null
    )
      if (Object.getPrototypeOf(p) === node) base = p as Extensible;
    bases.set(proto, base);
  }
  return base ?? undefined;
}

/** Gives Express's request `idempotencyKey` and `idempotency` accessors, once; false when `req` is no Express request. */
function extendRequestBase(req: Request): boolean {
  const base = baseOf(req, IncomingMessage.prototype);
  if (base === undefined) return false;
  if (base[kExtended] === true) return true;
  Object.defineProperties(base, {
    [kExtended]: { value: true },
    idempotencyKey: accessor((state) => state.execution.clientKey, 'idempotencyKey'),
    idempotency: accessor(
      (state) => (state.context ??= { key: state.execution.clientKey, db: state.execution.db }),
      'idempotency',
    ),
  });
  return true;
}

function accessor(read: (state: RequestState) => unknown, name: string): PropertyDescriptor {
  return {
    configurable: true,
    get(this: Request) {
      const state = states.get(this.res as Response);
      return state === undefined ? undefined : read(state);
    },
    // A handler may still assign it; its value then shadows ours on that request.
    set(this: Request, value: unknown) {
      Object.defineProperty(this, name, { value, writable: true, enumerable: true, configurable: true });
    },
  };
}

/**
 * Routes `write`/`end`/`writeHead` of Express's responses through the capture of covered ones, once; returns the
 * methods that Node's response has (what writes go on to), or `undefined` when `res` is no Express response.
 */
function extendResponseBase(res: Response): Readonly<Record<Method, AnyMethod>> | undefined {
  const base = baseOf(res, ServerResponse.prototype);
  if (base === undefined) return undefined;
  let methods = nodeMethods.get(base);
  if (methods !== undefined) return methods;
  const node = Object.getPrototypeOf(base) as Record<Method, AnyMethod>;
  methods = { write: node.write, end: node.end, writeHead: node.writeHead };
  nodeMethods.set(base, methods);
  if (base[kExtended] === true) return methods; // extended by another copy of this package
  const descriptors: PropertyDescriptorMap = { [kExtended]: { value: true } };
  for (const method of METHODS) {
    descriptors[method] = {
      configurable: true,
      writable: true,
      value: function captured(this: Response, ...args: unknown[]): unknown {
        const capture = states.get(this)?.capture;
        if (capture === undefined || !capture.intercepts(method)) return node[method].apply(this, args);
        return capture[method](this, args);
      },
    };
  }
  Object.defineProperties(base, descriptors);
  return methods;
}

const nodeMethods = new WeakMap<object, Readonly<Record<Method, AnyMethod>>>();

/**
 * Holds back what the handler writes — through res.json, res.send, res.write/res.end, writeHead or a pipe — until
 * the response has been stored, so that a client that got the response always finds it replayable. A body that
 * outgrows maxBodyBytes stops being held: it streams through, and the record keeps only its status (in
 * transactional mode all of it is held, since nothing may be sent before the commit).
 *
 * Writes reach it through Express's response prototype (`extendResponseBase`), except a method another middleware
 * had already wrapped as the response's own property (compression, on-headers): that one is wrapped in turn, so
 * what the handler writes is captured before that middleware transforms it, as it was mounted to do.
 */
class Capture {
  ended = false;
  readonly #res: Response;
  readonly #state: RequestState;
  /** The methods writes go on to when they are not held (what `res.write` etc. were before this capture). */
  readonly #original: Record<Method, AnyMethod>;
  /** Methods wrapped as own properties, to put back when the capture ends. */
  readonly #ownWrapped: Method[] = [];
  readonly #chunks: Buffer[] = [];
  readonly #callbacks: WriteCallback[] = [];
  #size = 0;
  #passThrough = false;
  #active = true;

  constructor(res: Response, state: RequestState) {
    this.#res = res;
    this.#state = state;
    const r = res as unknown as Record<Method, AnyMethod>;
    const node = extendResponseBase(res);
    this.#original =
      node === undefined ? { write: r.write, end: r.end, writeHead: r.writeHead } : { ...node };
    for (const method of METHODS) {
      // Express's response routes this method to us already, unless another middleware wrapped it on `res`.
      if (node !== undefined && !Object.hasOwn(res, method)) continue;
      this.#original[method] = r[method];
      this.#ownWrapped.push(method);
      const capture = this;
      r[method] = function capturedOwn(this: Response, ...args: unknown[]): unknown {
        return capture.intercepts(method)
          ? capture[method](this, args)
          : capture.#original[method].apply(this, args);
      };
    }
  }

  /** Whether a call to this method is held here (rather than passed on to the original). */
  intercepts(method: Method): boolean {
    return this.#active && !(this.#passThrough && method !== 'end');
  }

  /** Ends the capture: every method goes straight to the original again. */
  #stop(): void {
    this.#active = false;
    const r = this.#res as unknown as Record<Method, AnyMethod>;
    for (const method of this.#ownWrapped) r[method] = this.#original[method];
  }

  #call(method: Method, ...args: unknown[]): unknown {
    return this.#original[method].apply(this.#res, args);
  }

  // Resolves to a response to send instead of the handler's (a failed transactional commit), if any.
  async #settle(captured: CapturedResponse): Promise<StoredResponse | undefined> {
    const { execution, error } = this.#state;
    if (error === undefined) return execution.complete(captured);
    await execution.fail(error);
    return undefined;
  }

  // Too big to keep: send what we hold and let the rest through untouched; `end` stays captured to settle.
  #startPassThrough(): void {
    this.#passThrough = true;
    for (const chunk of this.#chunks) this.#call('write', chunk);
    this.#chunks.length = 0;
  }

  writeHead(res: Response, args: unknown[]): Response {
    res.statusCode = args[0] as number;
    let headers = args[1];
    if (typeof headers === 'string') {
      res.statusMessage = headers;
      headers = args[2];
    }
    if (Array.isArray(headers)) {
      // Raw header list: [name, value, name, value, ...] or [[name, value], ...].
      const flat = Array.isArray(headers[0]) ? headers.flat() : headers;
      for (let i = 0; i + 1 < flat.length; i += 2) res.setHeader(String(flat[i]), flat[i + 1] as string);
    } else if (headers !== null && typeof headers === 'object') {
      for (const [name, value] of Object.entries(headers))
        if (value !== undefined) res.setHeader(name, value as string);
    }
    return res;
  }

  write(_res: Response, args: unknown[]): boolean {
    const [chunk, encoding] = args;
    const cb = typeof encoding === 'function' ? encoding : args[2];
    const buffer = toBuffer(chunk as Chunk, encoding);
    this.#chunks.push(buffer);
    this.#size += buffer.byteLength;
    // The chunk is accepted into memory: say so now, or a handler awaiting its write callback would never resume.
    if (typeof cb === 'function') process.nextTick(cb as WriteCallback);
    if (this.#size > this.#state.execution.bufferLimit) this.#startPassThrough();
    return true;
  }

  end(res: Response, args: unknown[]): Response {
    let [chunk, encoding, cb] = args;
    if (typeof chunk === 'function') {
      cb = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (this.ended) return res;
    this.ended = true;
    if (chunk !== undefined && chunk !== null) {
      const buffer = toBuffer(chunk as Chunk, encoding);
      this.#chunks.push(buffer);
      this.#size += buffer.byteLength;
    }
    if (typeof cb === 'function') this.#callbacks.push(cb as WriteCallback);
    const callbacks = this.#callbacks;
    // Only when someone waits: a callback on Node's end costs a 'finish' listener.
    const done =
      callbacks.length === 0
        ? undefined
        : (): void => {
            for (const callback of callbacks) callback();
          };
    const execution = this.#state.execution;
    if (this.#size > execution.bufferLimit) {
      // Kept as executed with its status only (its replay is a 410); the body streams through now.
      if (!this.#passThrough) this.#startPassThrough();
      else for (const extra of this.#chunks) this.#call('write', extra);
      this.#stop();
      const headers = res.getHeaders();
      if (done === undefined) this.#call('end');
      else this.#call('end', done);
      void this.#settle({ status: res.statusCode, headers, body: undefined });
      return res;
    }
    const chunks = this.#chunks;
    const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, this.#size);
    const stored = this.#size <= execution.maxBodyBytes ? body : undefined;
    const status = res.statusCode;
    const headers = res.getHeaders();
    void this.#settle({ status, headers, body: stored }).then((replacement) => {
      this.#stop();
      if (replacement === undefined) {
        // While the store was asked, headersSent still read false: code running after the handler's answer (a
        // late error handler, say) may have changed status or headers. Send exactly what was stored.
        if (res.statusCode !== status) res.statusCode = status;
        if (!sameHeaders(res.getHeaders(), headers)) {
          for (const name of res.getHeaderNames()) if (!(name in headers)) res.removeHeader(name);
          for (const name in headers) res.setHeader(name, headers[name] as string | string[] | number);
        }
        if (done === undefined) this.#call('end', body);
        else this.#call('end', body, done);
        return;
      }
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      send(res, replacement);
      done?.();
    });
    return res;
  }
}

/** Whether two `getHeaders()` snapshots hold the same values (the same strings and the same arrays). */
function sameHeaders(
  now: Readonly<Record<string, unknown>>,
  before: Readonly<Record<string, unknown>>,
): boolean {
  let count = 0;
  for (const name in now) {
    if (now[name] !== before[name]) return false;
    count++;
  }
  for (const name in before) if (name !== '') count--;
  return count === 0;
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
      const state = states.get(res);
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
