/**
 * Idempotency-Key middleware for Express 4 and 5: `idempotency(options)` makes a retried request take effect
 * once, replaying the first response to the retries.
 *
 * @module @oncely/express
 */
import {
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type StoredResponse,
} from '@oncely/core';
import { conflictingOptions, type Registration, refuseNested, registrationOf } from '@oncely/core/adapter';
import { closedByClient, ResponseCapture } from '@oncely/core/node';
import type { ErrorRequestHandler, NextFunction, Request, RequestHandler, Response } from 'express';

declare global {
  namespace Express {
    interface Request {
      /** The Idempotency-Key this request runs under (unquoted), set on a request oncely covers. */
      idempotencyKey?: string;
      /** The key and, in transactional mode, the transaction's database client; set on a request oncely covers. */
      idempotency?: IdempotencyContext;
    }
  }
}

/** Options of the Express middleware: the shared options (docs/options.md); `scope` and `fingerprint` get the Express request. */
export type ExpressIdempotencyOptions = IdempotencyOptions<Request>;

/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';

// What a covered response carries, under a Symbol.for key so that two copies of this package in one app (a
// duplicated dependency) see each other's requests. Its shape carries a version, PROTOCOL: a copy of another shape
// leaves the request to the copy that took it.
const PROTOCOL = 3;
const kHeld = Symbol.for('oncely.express.held');

type HeldResponse = Response & { [kHeld]?: Held; _implicitHeader?: () => void };
type WriteCallback = (error?: Error | null) => void;
type Chunk = string | Uint8Array;
type AnyMethod = (this: Response, ...args: unknown[]) => unknown;

/**
 * Express middleware (Express 4 and 5): `app.use(idempotency())` covers every POST/PUT/PATCH; on one route,
 * `app.post('/charges', idempotency({ required: true }), handler)`. Options are checked here, once.
 * When two oncely middlewares meet one request (app-wide and route-level), the first that takes it handles it;
 * the second leaves it to the first if the options it sets agree with the first's, and refuses it otherwise
 * (see `stepAsideOrRefuse`). Only the requests it covers are touched: their `res.write`, `res.end` and
 * `res.writeHead` are wrapped on that response alone, as `compression` does.
 */
export function idempotency(options: ExpressIdempotencyOptions = {}): RequestHandler {
  const engine = new Idempotency<Request>(options);
  const registration = registrationOf(engine, options, idempotency, 'idempotency()');

  return function idempotencyMiddleware(req: Request, res: Response, next: NextFunction): void {
    if (!engine.covers(req.method)) {
      next();
      return;
    }
    const taken = (res as HeldResponse)[kHeld];
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
        const context: IdempotencyContext = execution.context;
        toDictionaryMode(req);
        toDictionaryMode(res);
        req.idempotencyKey = execution.clientKey;
        req.idempotency = context;
        new Held(res as HeldResponse, new ResponseCapture(execution, res), context, registration);
        // Inside the execution's context, so that currentIdempotency() works anywhere in the handler.
        execution.run(next);
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

/**
 * An error-handling middleware that shows oncely the errors handlers pass to `next(err)` (or throw), so the key is
 * released whatever status the app's error handler then answers (a 4xx included). Mount it after the routes and
 * before the app's own error handlers: `app.use(idempotency.errors())`. Without it, the status decides: an error
 * answered with a 5xx releases the key (Express's default error handler answers 500), one answered with a status
 * `cacheable` accepts is stored like any answer. It passes every error on unchanged.
 */
function errors(): ErrorRequestHandler {
  return function idempotencyErrors(error: unknown, _req: Request, res: Response, next: NextFunction): void {
    noteHandlerError(res, error);
    next(error);
  };
}
/**
 * The error-handling middleware that shows oncely the errors handlers pass to `next(err)`: mount
 * `app.use(idempotency.errors())` after the routes and before the app's own error handlers.
 */
idempotency.errors = errors;

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
  taken: Held,
  registration: Registration<Request>,
  res: Response,
  next: NextFunction,
): void {
  const outer = taken.registration;
  // Taken by this very middleware (mounted twice), or by a copy of another shape: left to it.
  if (outer === registration || taken.protocol !== PROTOCOL) {
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
  if (taken.noted === undefined) taken.noted = refusal.error;
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
  const held = ownHeld(res);
  if (held === undefined) return false;
  // An `undefined` thrown would not read as an error: note one.
  if (held.noted === undefined) held.noted = error ?? new Error('the handler failed');
  return true;
}

/**
 * Tells oncely that the framework gave up the handler of a covered request before it settled (NestJS unsubscribes
 * from it when the client leaves or a timeout interceptor fires) while it may still be running: the key is not
 * released, so no retry runs beside it; its lease lapses after `lockTimeout` (see `Execution.abandon`). Returns
 * whether oncely covers `res`.
 */
export function noteHandlerAbandoned(res: Response): boolean {
  const held = ownHeld(res);
  if (held === undefined) return false;
  if (!held.ended) held.capture.execution.abandon();
  return true;
}

/** What a response this version covers carries (a copy of another shape may hold it: that one is left alone). */
function ownHeld(res: Response): Held | undefined {
  const held = (res as HeldResponse)[kHeld];
  return held?.protocol === PROTOCOL ? held : undefined;
}

function send(res: Response, response: StoredResponse): void {
  res.statusCode = response.status;
  for (const name in response.headers) res.setHeader(name, response.headers[name] as string | string[]);
  res.end(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

/**
 * One covered response: holds back what the handler writes — through res.json, res.send, res.write/res.end,
 * writeHead or a pipe — until the response has been stored, so that a client that got the response always finds it
 * replayable (the body and the decisions about it are `@oncely/core/node`'s `ResponseCapture`). It wraps
 * `write`, `end`, `writeHead` and `_implicitHeader` on this response only, as own properties; a middleware mounted
 * before oncely that wrapped one of them (compression, on-headers) is wrapped in turn, so what the handler writes
 * is captured before that middleware transforms it, as it was mounted to do. `_implicitHeader` is what Node's own
 * `write` and `end` call to send the head: a library calling them directly (`ServerResponse.prototype.end.call`)
 * sends the response around the capture, which is then decided when it ends (executed once it finished).
 */
class Held {
  readonly protocol = PROTOCOL;
  readonly capture: ResponseCapture;
  readonly context: IdempotencyContext;
  /** The middleware that took the request, for another one nearer the route to compare its options with. */
  readonly registration: Registration<Request>;
  /** An error noted for this request (`idempotency.errors()`, `noteHandlerError`, a refusal): the key is released. */
  noted: unknown = undefined;
  /** The handler called `end()`. */
  ended = false;
  /** Calls are held here; false once the response went its own way. */
  active = true;
  readonly #res: HeldResponse;
  readonly #write: AnyMethod;
  readonly #end: AnyMethod;
  readonly #writeHead: AnyMethod;
  readonly #implicitHeader: AnyMethod;
  #callbacks: WriteCallback[] | undefined;
  /**
   * The head as it stood when the handler first wrote body bytes with `write` (held): without oncely it went out
   * then, so `headersSent` reads true from there on and a later answer cannot replace it.
   */
  #wroteHead: WrittenHead | undefined;

  constructor(
    res: HeldResponse,
    capture: ResponseCapture,
    context: IdempotencyContext,
    registration: Registration<Request>,
  ) {
    this.#res = res;
    this.capture = capture;
    this.context = context;
    this.registration = registration;
    const r = res as unknown as Record<string, AnyMethod> & { [kHeld]?: Held; _maxListeners?: unknown };
    this.#write = r.write as AnyMethod;
    this.#end = r.end as AnyMethod;
    this.#writeHead = r.writeHead as AnyMethod;
    this.#implicitHeader = r._implicitHeader as AnyMethod;
    r[kHeld] = this;
    r.write = heldWrite as AnyMethod;
    r.end = heldEnd as AnyMethod;
    r.writeHead = heldWriteHead as AnyMethod;
    r._implicitHeader = heldImplicitHeader as AnyMethod;
    // In transactional mode nothing may reach the client before the commit: a flush is only a hint, the head stays
    // held with the rest.
    if (context.db !== undefined) r.flushHeaders = heldFlushHeaders as AnyMethod;
    res.on('close', onClose);
    res.on('pipe', onPipe);
  }

  /** Whether Node sent the head (`headersSent` as Node reports it, below the one the held write sets). */
  headSent(): boolean {
    const head = this.#wroteHead;
    return head === undefined ? this.#res.headersSent : head.sent.call(this.#res);
  }

  /**
   * The handler wrote body bytes, held here: as Node would have sent the head then, `headersSent` reads true from now
   * on (so Express's error handling destroys the connection rather than answer again), and the head is noted to
   * tell a later answer that replaces it.
   */
  #wrote(): void {
    const res = this.#res;
    let sent: (() => boolean) | undefined;
    for (
      let o: object | null = Object.getPrototypeOf(res);
      o !== null && sent === undefined;
      o = Object.getPrototypeOf(o)
    )
      sent = Object.getOwnPropertyDescriptor(o, 'headersSent')?.get as (() => boolean) | undefined;
    this.#wroteHead = { status: res.statusCode, headers: res.getHeaders(), sent: sent ?? headSentByNode };
    Object.defineProperty(res, 'headersSent', { configurable: true, enumerable: false, get: alwaysTrue });
  }

  /** Whether a call of `write`/`writeHead` is held here (`end` is, also while the body streams through). */
  holds(): boolean {
    return this.active && !this.capture.streaming;
  }

  call(method: 'write' | 'end' | 'writeHead' | 'implicitHeader', ...args: unknown[]): unknown {
    const original =
      method === 'write'
        ? this.#write
        : method === 'end'
          ? this.#end
          : method === 'writeHead'
            ? this.#writeHead
            : this.#implicitHeader;
    return original.apply(this.#res, args);
  }

  /** Marks the answer begun; false when the client had left already (recorded as executed): pass the call on. */
  begin(): boolean {
    if (this.capture.began()) return true;
    this.active = false;
    return false;
  }

  /**
   * The head goes out around the capture (Node's own methods called on the response, `res.flushHeaders()`, or its
   * head sent before): what is held goes first, and the answer began. What is recorded is decided when the response
   * ends (`closed`): finished, executed without a body; failed or cut short before, as any answer that began.
   */
  wentAround(): void {
    this.active = false;
    const held = this.capture.drain();
    if (!this.headSent()) {
      // Node's end may have sized the head for its own chunk alone: what is held goes with it, so no length.
      if (held.length > 0) (this.#res as { _contentLength?: unknown })._contentLength = null;
      this.call('implicitHeader');
    }
    for (const chunk of held) this.call('write', chunk);
    this.capture.began();
  }

  writeHead(status: unknown, message: unknown, headers: unknown): Response {
    const res = this.#res;
    if (!this.holds()) return this.call('writeHead', status, message, headers) as Response;
    const code = nodeStatus(status);
    if (this.headSent()) {
      this.wentAround();
      return this.call('writeHead', status, message, headers) as Response;
    }
    if (!this.begin()) return this.call('writeHead', status, message, headers) as Response;
    res.statusCode = code;
    let fields = headers;
    if (typeof message === 'string') res.statusMessage = message;
    else fields = message;
    if (Array.isArray(fields)) {
      // Raw header list: [name, value, name, value, ...] or [[name, value], ...].
      // A name given twice keeps both values, as Node's writeHead sends them: those given replace any set before.
      const flat = Array.isArray(fields[0]) ? fields.flat() : fields;
      for (let i = 0; i + 1 < flat.length; i += 2) res.removeHeader(String(flat[i]));
      for (let i = 0; i + 1 < flat.length; i += 2) res.appendHeader(String(flat[i]), flat[i + 1] as string);
    } else if (fields !== null && typeof fields === 'object') {
      for (const [name, value] of Object.entries(fields))
        if (value !== undefined) res.setHeader(name, value as string);
    }
    return res;
  }

  write(chunk: unknown, encoding: unknown, callback: unknown): boolean {
    const res = this.#res;
    if (!this.holds()) return this.call('write', chunk, encoding, callback) as boolean;
    const cb = typeof encoding === 'function' ? encoding : callback;
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
    if (this.headSent()) {
      this.wentAround();
      return this.call('write', chunk, encoding, callback) as boolean;
    }
    // Node checks the status when the first write sends the head.
    res.statusCode = nodeStatus(res.statusCode);
    if (!this.begin()) return this.call('write', chunk, encoding, callback) as boolean;
    if (this.#wroteHead === undefined) this.#wrote();
    const held = this.capture.hold(chunk as Chunk, bufferEncoding(encoding));
    // The chunk is accepted into memory: say so now, or a handler awaiting its write callback would never resume.
    if (typeof cb === 'function') process.nextTick(cb as WriteCallback);
    // Too big to keep: send what is held and let the rest through untouched; `end` stays held to settle.
    if (!held) for (const buffer of this.capture.drain()) this.call('write', buffer);
    return true;
  }

  end(chunk: unknown, encoding: unknown, callback: unknown): Response {
    const res = this.#res;
    if (!this.active) return this.call('end', chunk, encoding, callback) as Response;
    let cb = callback;
    if (typeof chunk === 'function') {
      cb = chunk;
      chunk = undefined;
      encoding = undefined;
    } else if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (this.ended) {
      // As Node does after an end(): with a chunk it is a write after end; without, the callback waits for the
      // response to finish (it has not: it is held).
      if (chunk) writeAfterEnd(res, cb);
      else if (typeof cb === 'function') this.#onFinish(cb as WriteCallback);
      return res;
    }
    if (this.headSent() && !this.capture.streaming) {
      this.wentAround();
      return this.call('end', chunk, encoding, cb) as Response;
    }
    // As Node's end() does when it sends the head: an invalid status throws here, to the handler (whose framework
    // answers the error), before anything is held.
    res.statusCode = nodeStatus(res.statusCode);
    this.ended = true;
    if (typeof cb === 'function') this.#onFinish(cb as WriteCallback);
    const capture = this.capture;
    const hasChunk = chunk !== undefined && chunk !== null;
    if (capture.streaming) {
      // Over the limit before the end: the last chunk goes through too; kept as executed with its status only.
      this.#sendAndSettle(hasChunk ? [chunk as Chunk] : [], encoding);
      return res;
    }
    const head = this.#wroteHead;
    if (head !== undefined) {
      // Without oncely, a status set after the first write changes nothing sent; a header set throws
      // (ERR_HTTP_HEADERS_SENT, as an error handler's `res.status(500).json()` does): an answer replacing the head.
      res.statusCode = head.status;
      if (!sameHeaders(res.getHeaders(), head.headers)) {
        this.#replaced(head);
        return res;
      }
    }
    if (hasChunk && !capture.hold(chunk as Chunk, bufferEncoding(encoding))) {
      this.#sendAndSettle(capture.drain(), undefined);
      return res;
    }
    const body = capture.body();
    const status = res.statusCode;
    const headers = res.getHeaders();
    const settled =
      this.noted === undefined ? capture.finished(status, headers, body) : capture.failed(this.noted);
    void settled
      .then((replacement) => {
        this.active = false;
        const done = this.#finished();
        if (replacement === undefined) {
          // While the store was asked, headersSent still read false: code running after the handler's answer (a
          // late error handler, say) may have changed status or headers. Send exactly what was stored.
          if (res.statusCode !== status) res.statusCode = status;
          if (!sameHeaders(res.getHeaders(), headers)) {
            for (const name of res.getHeaderNames()) if (!(name in headers)) res.removeHeader(name);
            for (const name in headers) res.setHeader(name, headers[name] as string | string[] | number);
          }
          if (done === undefined) this.call('end', body);
          else this.call('end', body, done);
          return;
        }
        for (const name of res.getHeaderNames()) res.removeHeader(name);
        send(res, replacement);
        done?.();
      })
      .catch((error: unknown) => this.#sendFailed(error));
    return res;
  }

  /**
   * Another answer replaced the head after the handler wrote body bytes: without oncely that head and those bytes
   * were sent already and the connection is closed (Express does when a handler fails mid-response). So here: they
   * go out, the connection closes, and the key is released, never a merged body under the second answer's length.
   */
  #replaced(head: WrittenHead): void {
    const res = this.#res;
    this.active = false;
    const held = this.capture.drain();
    void this.capture
      .failed(this.noted ?? new Error('the response was answered again after its body began'))
      .catch(() => undefined);
    // Only what the new answer changed is put back, so the rest keeps the case it was set with.
    const now = res.getHeaders();
    for (const name in now) if (!(name in head.headers)) res.removeHeader(name);
    for (const name in head.headers)
      if (now[name] !== head.headers[name])
        res.setHeader(name, head.headers[name] as string | string[] | number);
    const last = held.length - 1;
    for (let i = 0; i < last; i++) this.call('write', held[i]);
    this.call('write', held[last] ?? EMPTY, () => res.destroy());
  }

  /** The body went over the limit: what is left goes out now and the record keeps the status only. */
  #sendAndSettle(chunks: Chunk[], encoding: unknown): void {
    const res = this.#res;
    this.active = false;
    for (const chunk of chunks) this.call('write', chunk, encoding);
    const status = res.statusCode;
    const headers = res.getHeaders();
    const done = this.#finished();
    if (done === undefined) this.call('end');
    else this.call('end', done);
    const capture = this.capture;
    void (
      this.noted === undefined ? capture.finished(status, headers, undefined) : capture.failed(this.noted)
    )
      .then(() => undefined)
      .catch((error: unknown) => this.#sendFailed(error));
  }

  #onFinish(callback: WriteCallback): void {
    if (this.#callbacks === undefined) this.#callbacks = [callback];
    else this.#callbacks.push(callback);
  }

  /** The end callbacks, as one callback for Node's end (a callback there costs a 'finish' listener: only if any). */
  #finished(): (() => void) | undefined {
    const callbacks = this.#callbacks;
    if (callbacks === undefined) return undefined;
    return (): void => {
      for (const callback of callbacks) callback();
    };
  }

  /** Sending the held answer threw: close the connection (a client must not wait for ever) and settle. */
  #sendFailed(error: unknown): void {
    this.active = false;
    this.#res.destroy();
    void this.capture.sendFailed(error);
  }

  /**
   * The response closed. Before it finished: the handler destroyed it with an error, or this server closed the
   * connection (Express does when a handler fails after its response began to stream), which is a failure and
   * releases the key; or the client left, which the capture decides on. Finished without our end: it was sent
   * around oncely, recorded as executed.
   */
  closed(): void {
    const res = this.#res;
    const capture = this.capture;
    if (capture.decided) return;
    if (this.noted !== undefined && !this.ended) void capture.failed(this.noted);
    else if (res.errored) void capture.failed(res.errored);
    else if (res.writableFinished) {
      if (!this.ended) capture.wentAround();
    } else if (!this.ended || capture.streaming) {
      if (closedByClient(res.req.socket)) capture.clientLeft();
      else void capture.failed(new Error('the connection was closed before the response ended'));
    }
    if (capture.decided) this.active = false;
  }

  /** A stream was piped into the response (`readable.pipe(res)`, `res.sendFile`): the answer began. */
  piped(): void {
    if (this.holds() && !this.ended) this.begin();
  }
}

/** The head when the handler first wrote, and how Node tells whether it sent one. */
interface WrittenHead {
  readonly status: number;
  readonly headers: Readonly<Record<string, unknown>>;
  readonly sent: (this: Response) => boolean;
}

const EMPTY = Buffer.alloc(0);

function alwaysTrue(): boolean {
  return true;
}

/** `headersSent` of Node's `http.ServerResponse`, for a response whose prototypes define none. */
function headSentByNode(this: Response): boolean {
  return (this as { _header?: unknown })._header != null;
}

function heldOf(res: HeldResponse): Held {
  return res[kHeld] as Held;
}

// Shared by every covered response (`this` is the response): no closure per request.
function heldWrite(this: HeldResponse, chunk: unknown, encoding?: unknown, callback?: unknown): boolean {
  return heldOf(this).write(chunk, encoding, callback);
}
function heldEnd(this: HeldResponse, chunk?: unknown, encoding?: unknown, callback?: unknown): Response {
  return heldOf(this).end(chunk, encoding, callback);
}
function heldWriteHead(this: HeldResponse, status: unknown, message?: unknown, headers?: unknown): Response {
  return heldOf(this).writeHead(status, message, headers);
}
function heldImplicitHeader(this: HeldResponse): unknown {
  const held = heldOf(this);
  // Node's own write or end is sending the head, and not on our behalf: the response goes around the capture.
  if (held.holds()) {
    held.wentAround();
    return undefined;
  }
  return held.call('implicitHeader');
}
function heldFlushHeaders(this: HeldResponse): void {
  const held = heldOf(this);
  if (held.holds()) held.begin();
  else Object.getPrototypeOf(this).flushHeaders.call(this);
}
function onClose(this: HeldResponse): void {
  heldOf(this).closed();
}
function onPipe(this: HeldResponse): void {
  heldOf(this).piped();
}

/**
 * Express replaces the prototype of every request and response (`Object.setPrototypeOf`), after which V8 caches no
 * hidden-class transitions for them: each property then added to one (oncely's, and those Express's router adds
 * after this middleware) builds a new hidden class. Deleting a property that was not the last one added turns the
 * object into a dictionary once, where adding one is a plain hash insert (docs/benchmarks.md has the measurements).
 * `_maxListeners` is such a property (EventEmitter's constructor sets it to `undefined`, as its prototype holds it),
 * so the emitter reads the same afterwards.
 */
function toDictionaryMode(emitter: object): void {
  const e = emitter as { _maxListeners?: unknown };
  if (Object.hasOwn(e, '_maxListeners') && e._maxListeners === undefined) delete e._maxListeners;
}

function bufferEncoding(encoding: unknown): BufferEncoding | undefined {
  return typeof encoding === 'string' ? (encoding as BufferEncoding) : undefined;
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
