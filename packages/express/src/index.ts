import { IncomingMessage, ServerResponse } from 'node:http';
import {
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type StoredResponse,
} from '@oncely/core';
import {
  type CapturedResponse,
  conflictingOptions,
  type Execution,
  type Registration,
  refuseNested,
  registrationOf,
} from '@oncely/core/adapter';
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

/** Options of the Express middleware: the shared options (docs/options.md); `scope` and `fingerprint` get the Express request. */
export type ExpressIdempotencyOptions = IdempotencyOptions<Request>;

/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';

// Symbol.for, so that two copies of this package in one app still see each other's state. Copies of different
// versions may meet (a duplicated dependency): the states map and the request accessors are shared by every version,
// and what they rely on never changes (a response in the map is held by some copy, which every other copy leaves
// alone; `state.context` is what the accessors read). Everything else carries the version of its shape, PROTOCOL:
// a copy of another shape installs its own dispatch and Layer patch beside these and ignores states not its own.
const PROTOCOL = 2;
const kStates = Symbol.for('oncely.express.states');
const kLayerPatched = Symbol.for(`oncely.express.layerPatched.v${PROTOCOL}`);

interface RequestState {
  /** The shape of this state and its capture (PROTOCOL of the copy that made it). */
  readonly protocol: number;
  execution: Execution;
  /** What `req.idempotency` reads; its `key` is what `req.idempotencyKey` reads. Stable across versions. */
  context: IdempotencyContext;
  /** An error a later handler passed on (seen through the patched Layer): the key is released. */
  error: unknown;
  /** The error a handler passed to `next(err)`, as the Layer saw it: cleared if the router goes on without it. */
  passedOn?: unknown;
  /** The response's capture while it holds the body back; `undefined` once the response went its own way. */
  capture: Capture | undefined;
  /**
   * The middleware that took the request, for another one nearer the route to compare its options with. Optional:
   * a copy of this package from before it was added leaves it out (its requests are then left to it).
   */
  registration?: Registration<Request>;
}

/**
 * Covered requests' state, keyed by response, shared across copies of this package (below). A WeakMap rather than a
 * property: Express replaces the prototype of every request and response (`Object.setPrototypeOf`), after which V8
 * caches no hidden-class transitions for them, so each property added to one builds a new hidden class: 1.3–4.5 µs
 * each in `pnpm --filter @oncely/benchmarks micro:props`, and more again in garbage collection under load (the two
 * `req` properties alone took ~100 µs of server CPU per Express + Memory first execution on this 2-core machine).
 * So nothing is added to a covered request or response when it can be avoided: `req.idempotencyKey` and
 * `req.idempotency` are accessors on `IncomingMessage.prototype` that read this map, and `res.write`/`res.end`/
 * `res.writeHead` are dispatched from `ServerResponse.prototype` (see `installPrototypeHooks`). Both sit below every
 * Express copy's prototypes, so handlers of another Express copy or a sub-app go through them too; where something
 * shadows them (a middleware that wrapped `res.end`, a value set on `req` by hand) oncely falls back to own
 * properties on that one request.
 */
// Kept on ServerResponse.prototype, which every copy of this package and every vm context (Jest runs each test file
// in one) shares with Node's http module, as the dispatch installed there does: a map per copy would leave a later
// copy's responses unseen by the dispatch the first copy installed.
const statesHolder = ServerResponse.prototype as unknown as { [kStates]?: WeakMap<Response, RequestState> };
if (statesHolder[kStates] === undefined)
  Object.defineProperty(statesHolder, kStates, { value: new WeakMap<Response, RequestState>() });
const states = statesHolder[kStates] as WeakMap<Response, RequestState>;

/**
 * Express middleware (Express 4 and 5): `app.use(idempotency())` covers every POST/PUT/PATCH; on one route,
 * `app.post('/charges', idempotency({ required: true }), handler)`. Options are checked here, once.
 * When two oncely middlewares meet one request (app-wide and route-level), the first that takes it handles it;
 * the second leaves it to the first if the options it sets agree with the first's, and refuses it otherwise
 * (see `stepAsideOrRefuse`).
 */
export function idempotency(options: ExpressIdempotencyOptions = {}): RequestHandler {
  const engine = new Idempotency<Request>(options);
  const registration = registrationOf(engine, options, idempotency, 'idempotency()');
  const hooks = installPrototypeHooks();

  return function idempotencyMiddleware(req: Request, res: Response, next: NextFunction): void {
    if (!engine.covers(req.method)) {
      next();
      return;
    }
    const taken = states.get(res);
    if (taken !== undefined) {
      stepAsideOrRefuse(taken, registration, res, next);
      return;
    }
    const body = parsedBody(req);
    engine.warnIfBodyUnparsed(req.headers, body, 'express.json() (or another body parser)');
    engine
      .handle({
        method: req.method,
        url: req.originalUrl,
        headers: req.headers,
        body,
        request: req,
      })
      .then((decision) => {
        // Something else (a timeout middleware, say) answered while the store was being asked, or the client left
        // (its 'close' came before the listener below exists, and NestJS then gives the request up): do nothing
        // more, and free the key if we hold it, so the client's retry runs the handler.
        if (res.headersSent || res.writableEnded || res.destroyed) {
          if (decision.action === 'execute')
            void (res.headersSent || res.writableEnded
              ? decision.execution.fail(new Error('response already sent'))
              : decision.execution.clientGone());
          return;
        }
        if (decision.action === 'pass') return next();
        if (decision.action === 'respond') return send(res, decision.response);
        const { execution } = decision;
        execution.headersBeforeHandler(res.getHeaders());
        const context: IdempotencyContext = { key: execution.clientKey, db: execution.db };
        const state: RequestState = {
          protocol: PROTOCOL,
          execution,
          context,
          error: undefined,
          passedOn: undefined,
          capture: undefined,
          registration,
        };
        states.set(res, state);
        // The accessors on IncomingMessage.prototype read the state through `req.res`; anything else gets properties.
        if (req.res !== res || !(req instanceof IncomingMessage) || shadowsAccessors(req)) {
          req.idempotencyKey = execution.clientKey;
          req.idempotency = context;
        }
        patchLayer(req);
        state.capture = new Capture(res, state, hooks);
        // A response that closes without passing through our end: Express destroys the socket when a handler fails
        // after streaming began (release the noted error), the handler destroyed it with an error (released), or
        // something sent it around oncely (Node's methods
        // called on it directly): recorded as executed without a body. Without either, the handler may still be
        // running (the client merely left): the lease stays.
        res.on('close', () => {
          if (state.error !== undefined) void execution.fail(state.error);
          // The handler destroyed the response with an error (a failed `pipeline(source, res)`): it is done, and it
          // failed. A client that merely left leaves `errored` null.
          else if (res.errored) void execution.fail(res.errored);
          else if (res.writableFinished && state.capture?.ended === false)
            void execution.complete({ status: res.statusCode, headers: res.getHeaders(), body: undefined });
          // The connection closed before the response ended: the client left, and a pipe into the response
          // stopped with it (`readable.pipe(res)`, `res.sendFile`), so no end() may ever come.
          else if (!res.writableFinished) state.capture?.closedEarly();
        });
        // A stream piped into the response is an answer begun, though the close may leave it without a byte written.
        res.once('pipe', () => state.capture?.piped());
        next();
      })
      .catch((error: unknown) => {
        // Express's own next(err) does not throw; this keeps the chain from ever ending in an unhandled rejection.
        try {
          next(error);
        } catch (nextError) {
          engine.options.logger?.error({ err: nextError }, 'oncely: could not answer a failed request');
          res.destroy();
        }
      });
  };
}

export default idempotency;

/**
 * A middleware meets a request that another one (app-wide, say) took first. Express gives no way to know, before a
 * request reaches its route, which middlewares the route has, so the outer one cannot leave the request to this
 * one. If this one sets no option that changes which record the request maps to, what is stored or how it is
 * answered, the outer one's handling is this one's too, and it steps aside (a `required: true` over the same store
 * is such a one: the outer one took the request by its key). Otherwise applying either one's options would be
 * wrong: the request is refused with a 500 naming both, and the outer one's key is released as the response ends.
 */
function stepAsideOrRefuse(
  taken: RequestState,
  registration: Registration<Request>,
  res: Response,
  next: NextFunction,
): void {
  const outer = taken.registration;
  // Taken by this very middleware (mounted twice), or by a copy that does not say how: left to it.
  if (outer === undefined || outer === registration || taken.protocol !== PROTOCOL) {
    next();
    return;
  }
  const names = conflictingOptions(outer.engine.options, registration);
  if (names.length === 0) {
    next();
    return;
  }
  const refusal = refuseNested(outer as Registration<never>, registration as Registration<never>, names);
  // Sent through the outer one's capture, which releases its key rather than store this answer.
  if (taken.error === undefined) taken.error = refusal.error;
  send(res, refusal.response);
}

/**
 * The body a parser left on `req.body`, or `undefined` when none parsed it. Express 4's parsers (body-parser 1)
 * set `req.body = {}` even for a request they skip (another content type, a parser mounted only on the route), and
 * mark the ones they parse with `req._body`. An empty `{}` without that mark, on a request with a body that nobody
 * has read, was parsed by no one: hashing it would make every such body look alike (a reused key with another body
 * replayed instead of refused), so it counts as not parsed and the warning says so, as Express 5 leaves
 * `req.body` undefined. Express 5's parsers set no mark but read the body before setting `req.body`.
 */
function parsedBody(req: Request): unknown {
  const body: unknown = req.body;
  if (
    typeof body === 'object' &&
    body !== null &&
    (req as { _body?: unknown })._body !== true &&
    Object.getPrototypeOf(body) === Object.prototype &&
    Object.keys(body).length === 0 &&
    !req.readableEnded &&
    hasBody(req.headers)
  ) {
    return undefined;
  }
  return body;
}

/** Whether the request says it carries a body (what body-parser checks before reading). */
function hasBody(headers: Request['headers']): boolean {
  return (
    headers['transfer-encoding'] !== undefined ||
    (headers['content-length'] !== undefined && headers['content-length'] !== '0')
  );
}

/**
 * Tells oncely that the handler of a covered request failed although no error reached Express's `next(err)`, for
 * frameworks that turn a handler's error into a response themselves (NestJS's exception filters): the key is
 * released when that response ends, instead of the response being stored. Returns whether oncely covers `res`.
 */
export function noteHandlerError(res: Response, error: unknown): boolean {
  const state = ownState(res);
  if (state === undefined) return false;
  // An `undefined` thrown would not read as an error: note one.
  if (state.error === undefined) state.error = error ?? new Error('the handler failed');
  return true;
}

/**
 * Tells oncely that the framework gave up the handler of a covered request before it settled (NestJS unsubscribes
 * from it when the client leaves or a timeout interceptor fires) while it may still be running: the key is not
 * released, so no retry runs beside it; its lease lapses after `lockTimeout` (see `Execution.abandon`). Returns
 * whether oncely covers `res`.
 */
export function noteHandlerAbandoned(res: Response): boolean {
  const state = ownState(res);
  if (state === undefined) return false;
  if (state.capture?.ended !== true) state.execution.abandon();
  return true;
}

/** The state of a response this version covers (a copy of another shape may hold it: that one is left alone). */
function ownState(res: Response): RequestState | undefined {
  const state = states.get(res);
  return state?.protocol === PROTOCOL ? state : undefined;
}

/**
 * Whether something between a request and IncomingMessage.prototype (the request itself, an app's or Express's
 * request prototype) has its own `idempotencyKey` or `idempotency`, which would hide the accessors.
 */
function shadowsAccessors(req: Request): boolean {
  for (
    let o: object | null = req;
    o !== null && o !== IncomingMessage.prototype;
    o = Object.getPrototypeOf(o)
  ) {
    if (Object.hasOwn(o, 'idempotencyKey') || Object.hasOwn(o, 'idempotency')) return true;
  }
  return false;
}

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

/**
 * Holds back what the handler writes — through res.json, res.send, res.write/res.end, writeHead or a pipe — until
 * the response has been stored, so that a client that got the response always finds it replayable. A body that
 * outgrows maxBodyBytes stops being held: it streams through, and the record keeps only its status (in
 * transactional mode all of it is held, since nothing may be sent before the commit).
 *
 * A middleware mounted before oncely that wrapped one of these methods (compression, on-headers) is wrapped in
 * turn, so what the handler writes is captured before that middleware transforms it, as it was mounted to do.
 */
class Capture {
  ended = false;
  readonly #res: Response;
  readonly #state: RequestState;
  /** The methods writes go on to when they are not held (what `res.write` etc. were before this capture). */
  readonly #original: Record<Method, AnyMethod>;
  readonly #chunks: Buffer[] = [];
  readonly #callbacks: WriteCallback[] = [];
  #size = 0;
  #passThrough = false;
  #active = true;
  /** The handler began its answer (wrote to it, or its head): what its early end is recorded as. */
  #begun = false;
  /** A stream was piped into the response: the answer began, whether or not a chunk of it was written. */
  #piped = false;
  /** The connection closed before the response ended. */
  #closed = false;

  constructor(res: Response, state: RequestState, hooks: ResponseHooks) {
    this.#res = res;
    this.#state = state;
    const r = res as unknown as Record<Method, AnyMethod>;
    // The usual case: nothing shadows ServerResponse.prototype's dispatch, which finds this capture in `states`.
    if (
      r.write === hooks.dispatch.write &&
      r.end === hooks.dispatch.end &&
      r.writeHead === hooks.dispatch.writeHead
    ) {
      this.#original = hooks.original;
      return;
    }
    this.#original = { write: r.write, end: r.end, writeHead: r.writeHead };
    for (const method of METHODS) {
      const capture = this;
      r[method] = function captured(this: Response, ...args: unknown[]): unknown {
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

  /**
   * Ends the capture: every method goes straight to the original again. The wrappers stay on the response (each
   * store to it costs, see `states`); they only pass calls on from here.
   */
  #stop(): void {
    this.#active = false;
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

  /**
   * The connection closed before the response ended (see the 'close' listener). An answer the handler had begun
   * cannot be completed any more (a pipe into the response stops with it): recorded as executed now, by the engine.
   * One it had not begun may still come, the handler running on; the first write to it decides then.
   */
  closedEarly(): void {
    if (this.ended || !this.#active) return;
    this.#closed = true;
    if (this.#begun || this.#piped) this.#endedEarly();
  }

  /**
   * A stream was piped into the response (`readable.pipe(res)`, `res.sendFile`, Nest's `StreamableFile`): the
   * answer began. Its source stops with the connection (`send`, Nest destroy it), maybe before writing anything, so
   * a close before or after the pipe ends the response early all the same.
   */
  piped(): void {
    if (this.ended || !this.#active) return;
    this.#piped = true;
    if (this.#closed) this.#endedEarly();
  }

  #endedEarly(): void {
    this.#stop();
    this.#chunks.length = 0;
    void this.#state.execution.endedEarly(this.#res.statusCode, this.#res.getHeaders());
  }

  /** Marks the answer begun; false when the connection is closed already, and the call goes on to Node. */
  #begin(): boolean {
    this.#begun = true;
    if (!this.#closed) return true;
    this.#endedEarly();
    return false;
  }

  // Too big to keep: send what we hold and let the rest through untouched; `end` stays captured to settle.
  #startPassThrough(): void {
    this.#passThrough = true;
    for (const chunk of this.#chunks) this.#call('write', chunk);
    this.#chunks.length = 0;
  }

  writeHead(res: Response, args: unknown[]): Response {
    const status = nodeStatus(args[0]);
    if (!this.#begin()) return this.#call('writeHead', ...args) as Response;
    res.statusCode = status;
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

  write(res: Response, args: unknown[]): boolean {
    const [chunk, encoding] = args;
    const cb = typeof encoding === 'function' ? encoding : args[2];
    if (this.ended) {
      // Node checks the chunk before it looks at the state.
      if (chunk === null)
        throw nodeError(TypeError, 'ERR_STREAM_NULL_VALUES', 'May not write null values to stream');
      if (typeof chunk !== 'string' && !(chunk instanceof Uint8Array)) {
        throw nodeError(
          TypeError,
          'ERR_INVALID_ARG_TYPE',
          'The "chunk" argument must be of type string or Buffer',
        );
      }
      return writeAfterEnd(res, cb);
    }
    // Node checks the status when the first write sends the head.
    if (!this.#begun) res.statusCode = nodeStatus(res.statusCode);
    if (!this.#begin()) return this.#call('write', ...args) as boolean;
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
    if (this.ended) {
      // As Node does after an end(): with a chunk it is a write after end; without, the callback waits for the
      // response to finish (it has not: it is held).
      if (chunk) writeAfterEnd(res, cb);
      else if (typeof cb === 'function') this.#callbacks.push(cb as WriteCallback);
      return res;
    }
    // As Node's end() does when it sends the head: an invalid status throws here, to the handler (whose framework
    // answers the error), before anything is held.
    if (!this.#begun) res.statusCode = nodeStatus(res.statusCode);
    this.ended = true;
    if (chunk !== undefined && chunk !== null) {
      const buffer = toBuffer(chunk as Chunk, encoding);
      this.#chunks.push(buffer);
      this.#size += buffer.byteLength;
    }
    if (typeof cb === 'function') this.#callbacks.push(cb as WriteCallback);
    const callbacks = this.#callbacks;
    // Only when someone waits: a callback on Node's end costs a 'finish' listener. Read when the response goes
    // out, since a second end() while the store is asked may add one.
    const finished = (): (() => void) | undefined =>
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
      const done = finished();
      if (done === undefined) this.#call('end');
      else this.#call('end', done);
      void this.#settle({ status: res.statusCode, headers, body: undefined }).catch((error: unknown) =>
        this.#sendFailed(error),
      );
      return res;
    }
    const chunks = this.#chunks;
    const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, this.#size);
    const stored = this.#size <= execution.maxBodyBytes ? body : undefined;
    const status = res.statusCode;
    const headers = res.getHeaders();
    void this.#settle({ status, headers, body: stored })
      .then((replacement) => {
        this.#stop();
        const done = finished();
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
      })
      .catch((error: unknown) => this.#sendFailed(error));
    return res;
  }

  /** Sending the held answer threw: close the connection (a client must not wait for ever) and settle. */
  #sendFailed(error: unknown): void {
    this.#stop();
    this.#res.destroy();
    void this.#state.execution.sendFailed(error);
  }
}

/**
 * The status as Node's `writeHead` takes it (`statusCode | 0`), or Node's own error for one it refuses, so that a
 * handler's bad status fails where and as it would without oncely.
 */
function nodeStatus(value: unknown): number {
  const status = (value as number) | 0;
  if (status < 100 || status > 999) {
    throw nodeError(RangeError, 'ERR_HTTP_INVALID_STATUS_CODE', `Invalid status code: ${String(value)}`);
  }
  return status;
}

/**
 * A write after end() while the response is held: what Node does for one after it has ended (the callback gets
 * ERR_STREAM_WRITE_AFTER_END, then the response emits it as 'error'; false is returned), so a handler bug shows the
 * same with oncely as without. The chunk is neither sent nor stored.
 */
function writeAfterEnd(res: Response, cb: unknown): false {
  const error = nodeError(Error, 'ERR_STREAM_WRITE_AFTER_END', 'write after end');
  process.nextTick(() => {
    if (typeof cb === 'function') (cb as (error: Error) => void)(error);
    if (!res.destroyed) res.emit('error', error);
  });
  return false;
}

/** An error as Node's own carry it: a `code`, and the code in the name (`Error [ERR_...]`). */
function nodeError(
  Type: ErrorConstructor | TypeErrorConstructor | RangeErrorConstructor,
  code: string,
  message: string,
): Error {
  return Object.assign(new Type(message), { code });
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

interface ResponseHooks {
  /** ServerResponse's own methods, as they were before oncely. */
  readonly original: Readonly<Record<Method, AnyMethod>>;
  /** What oncely put on ServerResponse.prototype in their place. */
  readonly dispatch: Readonly<Record<Method, AnyMethod>>;
}
const kResponseHooks = Symbol.for(`oncely.express.responseHooks.v${PROTOCOL}`);
const kRequestAccessors = Symbol.for('oncely.express.requestAccessors');

/**
 * Installs, once per process (shared by every copy of this package through `Symbol.for`), what lets oncely cover a
 * request without adding properties to it (see `states`): `write`, `end` and `writeHead` on
 * `ServerResponse.prototype` that hand a covered response's calls to its capture and pass every other call straight
 * to Node's own method (one WeakMap lookup), and the `req.idempotencyKey` / `req.idempotency` accessors on
 * `IncomingMessage.prototype` (a value assigned to either becomes the request's own property, as before).
 */
function installPrototypeHooks(): ResponseHooks {
  const responsePrototype = ServerResponse.prototype as unknown as Record<Method, AnyMethod> & {
    [kResponseHooks]?: ResponseHooks;
  };
  let hooks = responsePrototype[kResponseHooks];
  if (hooks === undefined) {
    const original = {
      write: inheritedOr(responsePrototype, 'write'),
      end: inheritedOr(responsePrototype, 'end'),
      writeHead: inheritedOr(responsePrototype, 'writeHead'),
    };
    const dispatch = {
      write: function write(this: Response, ...args: unknown[]): unknown {
        const capture = ownState(this)?.capture;
        return capture?.intercepts('write') ? capture.write(this, args) : original.write.apply(this, args);
      },
      end: function end(this: Response, ...args: unknown[]): unknown {
        const capture = ownState(this)?.capture;
        return capture?.intercepts('end') ? capture.end(this, args) : original.end.apply(this, args);
      },
      writeHead: function writeHead(this: Response, ...args: unknown[]): unknown {
        const capture = ownState(this)?.capture;
        return capture?.intercepts('writeHead')
          ? capture.writeHead(this, args)
          : original.writeHead.apply(this, args);
      },
    };
    hooks = { original, dispatch };
    Object.defineProperty(responsePrototype, kResponseHooks, { value: hooks });
    for (const method of METHODS)
      Object.defineProperty(responsePrototype, method, {
        value: dispatch[method],
        writable: true,
        configurable: true,
        enumerable: false,
      });
  }

  const requestPrototype = IncomingMessage.prototype as IncomingMessage & { [kRequestAccessors]?: true };
  if (requestPrototype[kRequestAccessors] !== true) {
    Object.defineProperty(requestPrototype, kRequestAccessors, { value: true });
    const accessor = (name: 'idempotencyKey' | 'idempotency', read: (state: RequestState) => unknown) => ({
      configurable: true,
      enumerable: false,
      get(this: IncomingMessage & { res?: Response }): unknown {
        const state = this.res === undefined ? undefined : states.get(this.res);
        return state === undefined ? undefined : read(state);
      },
      set(this: IncomingMessage, value: unknown): void {
        Object.defineProperty(this, name, { value, writable: true, configurable: true, enumerable: true });
      },
    });
    Object.defineProperty(
      requestPrototype,
      'idempotencyKey',
      accessor('idempotencyKey', (state) => state.context.key),
    );
    Object.defineProperty(
      requestPrototype,
      'idempotency',
      accessor('idempotency', (state) => state.context),
    );
  }
  return hooks;
}

/**
 * What the dispatch passes a call on to: ServerResponse.prototype's own method when it has one (`writeHead`; or
 * whatever an earlier instrumentation put there), else its parent's method looked up at each call (`write` and
 * `end` live on OutgoingMessage.prototype), so that what an APM or a test library puts there later still runs for
 * every response, covered or not.
 */
function inheritedOr(prototype: Record<Method, AnyMethod>, method: Method): AnyMethod {
  if (Object.hasOwn(prototype, method)) return prototype[method];
  const parent = Object.getPrototypeOf(prototype) as Record<Method, AnyMethod>;
  return function inherited(this: Response, ...args: unknown[]): unknown {
    return parent[method].apply(this, args);
  };
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
  // `req.app` is missing when a Router is mounted on a plain http server: nothing to patch there.
  const app = req.app as unknown as
    | { _router?: { stack?: object[] }; router?: { stack?: object[] } }
    | undefined;
  const stack = app?._router?.stack ?? app?.router?.stack;
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
      const state = ownState(res);
      if (state === undefined) return original.call(this, req, res, next);
      // The router runs a request handler only while no error is pending: one passed on before was recovered from
      // (an error handler called `next()` without it), so the answer that follows is stored like any other.
      if (state.passedOn !== undefined && state.error === state.passedOn)
        state.error = state.passedOn = undefined;
      const observed = ((error?: unknown) => {
        if (
          error !== undefined &&
          error !== null &&
          error !== 'route' &&
          error !== 'router' &&
          state.error === undefined
        ) {
          state.error = state.passedOn = error;
        }
        return next(error as Error);
      }) as NextFunction;
      return original.call(this, req, res, observed);
    };
  }
}
