/**
 * Idempotency-Key middleware for Koa: a retried request takes effect once and its retries get the first response.
 *
 * @module @oncely/koa
 */
import { Readable } from 'node:stream';
import {
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type StoredResponse,
} from '@oncely/core';
import { conflictingOptions, type Registration, refuseNested, registrationOf } from '@oncely/core/adapter';
import { ResponseCapture } from '@oncely/core/node';
import type { Context, Middleware, Next } from 'koa';

/** Options of the Koa middleware: the shared options (docs/options.md); `scope` and `fingerprint` get Koa's `Context`. */
export type KoaIdempotencyOptions = IdempotencyOptions<Context>;

/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';

/** What the middleware sets on `ctx.state` of a request it covers. */
export interface IdempotencyState {
  /** The Idempotency-Key this request runs under (unquoted); `undefined` when oncely does not cover the request. */
  idempotencyKey?: string;
  /** The key and, in transactional mode, the transaction's database client; `undefined` likewise. */
  idempotency?: IdempotencyContext;
}

declare module 'koa' {
  // Typed `ctx.state.idempotencyKey` in every middleware and route.
  interface DefaultState extends IdempotencyState {}
}

// Marks a context an oncely middleware already holds, the same symbol in every copy of this package: when two meet
// one request (app-wide and on a route), the first that takes it handles it, and the second compares its options
// with the first's (see `stepAsideOrRefuse`), as in the Express adapter. On the context, which Koa makes afresh per
// request, so the mark goes with it. (A copy from before the holder marked it `true`.)
const kHeld = Symbol.for('oncely.koa.held');
type HeldContext = Context & { [kHeld]?: Holder | true };

interface Holder {
  /** The middleware that took the request. */
  readonly registration: Registration<Context>;
  /** Set by a middleware nearer the route that refused the request: the holder releases its key. */
  refused: Error | undefined;
}

/**
 * Koa middleware (Koa 3): `app.use(idempotency())` covers every POST/PUT/PATCH; on one `@koa/router` route,
 * `router.post('/charges', idempotency({ required: true }), handler)`. Mount a body parser before it: the parsed
 * body is part of the fingerprint. When the middlewares after it are done, the response they left in `ctx.body`
 * (a string, Buffer, object, or a stream, read here) is stored before Koa sends it; a retry gets it back with
 * `Idempotent-Replayed: true`. Options are checked here, once.
 */
export function idempotency(options: KoaIdempotencyOptions = {}): Middleware {
  const engine = new Idempotency<Context>(options);
  const registration = registrationOf(engine, options, idempotency, 'idempotency()');

  return async function idempotencyMiddleware(ctx: Context, next: Next): Promise<void> {
    const req = ctx.req;
    if (!engine.covers(req.method as string)) return next();
    const held = (ctx as HeldContext)[kHeld];
    if (held !== undefined) return stepAsideOrRefuse(ctx, held, registration, next);
    const body = parsedBody(ctx);
    engine.warnIfBodyUnparsed(req.headers, body, 'a body parser (@koa/bodyparser)');
    const decision = await engine.handle({
      method: req.method as string,
      url: ctx.originalUrl,
      headers: req.headers,
      body,
      request: ctx,
    });
    // Something else answered while the store was asked (a timeout, say), or the client left: do nothing more, and
    // free the key we hold, so the client's retry runs the handler (Koa sends nothing to a closed socket).
    // (Over HTTP/2, Node's compatibility response has no `destroyed`: its stream has.)
    const res = ctx.res as typeof ctx.res & { stream?: { destroyed?: boolean } };
    if (res.headersSent || res.destroyed === true || res.stream?.destroyed === true) {
      if (decision.action === 'execute')
        await (res.headersSent
          ? decision.execution.fail(new Error('response already sent'))
          : decision.execution.clientGone());
      return;
    }
    if (decision.action === 'pass') return next();
    if (decision.action === 'respond') return send(ctx, decision.response);
    const { execution } = decision;
    const holder: Holder = { registration, refused: undefined };
    (ctx as HeldContext)[kHeld] = holder;
    ctx.state.idempotencyKey = execution.clientKey;
    ctx.state.idempotency = execution.context;
    // Headers set before oncely ran (CORS, a request id) belong to the middlewares outside it, which set them
    // afresh on a replay: only what the inner ones set or change is stored.
    execution.headersBeforeHandler(ctx.res.getHeaders());
    const capture = new ResponseCapture(execution, ctx.res);
    try {
      // Inside the execution's context: currentIdempotency() answers in every middleware after this one.
      await execution.run(next);
      // A middleware nearer the route refused the request (its answer is in ctx): nothing of it is stored.
      if (holder.refused !== undefined) await capture.failed(holder.refused);
      else await captureBody(ctx, capture);
    } catch (error) {
      // Thrown by a later middleware or the handler (or the body failed before any of it was sent): the key is
      // released, so a retry runs again, and the error goes on to the app's error handling as usual.
      if (!capture.decided) await capture.failed(error);
      throw error;
    }
  };
}

export default idempotency;

/**
 * A middleware meets a request that another one (app-wide, say) took first: Koa runs the app's middlewares before
 * the router picks a route, so the outer one cannot leave the request to this one. If this one sets no option that
 * changes which record the request maps to, what is stored or how it is answered, it steps aside (a
 * `required: true` over the same store is such a one: the outer one took the request by its key). Otherwise
 * applying either one's options would be wrong: the request is refused with a 500 naming both, and the outer one
 * releases its key instead of storing that answer.
 */
function stepAsideOrRefuse(
  ctx: Context,
  held: Holder | true,
  registration: Registration<Context>,
  next: Next,
): Promise<void> {
  // Taken by this very middleware (mounted twice), or by a copy that does not say how: left to it.
  if (held === true || held.registration === registration) return next();
  const names = conflictingOptions(held.registration.engine.options, registration);
  if (names.length === 0) return next();
  const refusal = refuseNested(
    held.registration as Registration<never>,
    registration as Registration<never>,
    names,
  );
  held.refused ??= refusal.error;
  send(ctx, refusal.response);
  return Promise.resolve();
}

/**
 * The body a parser left on `ctx.request.body`, or `undefined` when none parsed it. @koa/bodyparser (and
 * koa-bodyparser) sets `{}`, with no `rawBody`, for a content type it does not parse (text by default, JSON too when
 * `enableTypes` leaves it out), and marks what it parses with `rawBody`. An empty `{}` without that mark, on a
 * request with a body that nobody has read, was parsed by no one: hashing it would make every such body look alike
 * (a reused key with another body replayed instead of refused), so it counts as not parsed and the warning says so.
 * Parsers that set no `rawBody` (koa-body) read the body before setting it.
 */
function parsedBody(ctx: Context): unknown {
  const request = ctx.request as { body?: unknown; rawBody?: unknown };
  const body = request.body;
  const headers = ctx.req.headers;
  if (
    request.rawBody === undefined &&
    typeof body === 'object' &&
    body !== null &&
    Object.getPrototypeOf(body) === Object.prototype &&
    Object.keys(body).length === 0 &&
    !ctx.req.readableEnded &&
    (headers['transfer-encoding'] !== undefined ||
      (headers['content-length'] !== undefined && headers['content-length'] !== '0'))
  ) {
    return undefined;
  }
  return body;
}

/** Sends a stored response (a replay or one of the engine's problem answers) through Koa. */
function send(ctx: Context, response: StoredResponse): void {
  ctx.status = response.status;
  for (const name in response.headers) ctx.set(name, response.headers[name] as string | string[]);
  ctx.body = Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength);
  // Koa types a Buffer body application/octet-stream when no type is set: a response stored without one keeps none.
  if (response.headers['content-type'] === undefined) ctx.remove('Content-Type');
}

interface KoaResponseInternals {
  /** Koa's mark for `ctx.body = null` (an empty body, sent as such), as opposed to no body set at all. */
  _explicitNullBody?: boolean;
  /** Koa's mark for a status set by the app, as opposed to its default 404. */
  _explicitStatus?: boolean;
}

// Statuses Koa sends without a body, whatever ctx.body holds (its `statuses.empty`).
const EMPTY_STATUSES = new Set([204, 205, 304]);

/**
 * Stores what Koa is about to send for this request, leaving `ctx.body` as a Buffer of the exact bytes stored, as a
 * replay's is, so that what the client gets and what a retry gets are the same, and middleware mounted before
 * oncely sees the same on both. It runs after this and may transform the response (compression, say); it does the
 * same to a replay.
 */
async function captureBody(ctx: Context, capture: ResponseCapture): Promise<void> {
  const res = ctx.res;
  if (ctx.respond === false || res.headersSent) {
    // The handler answers through ctx.res itself, around Koa and oncely: its bytes cannot be held, so the
    // request is kept as executed (status only; a retry gets a 410) once the response is finished.
    const executed = () => (res.writableFinished ? capture.wentAround() : capture.cutShort());
    if (res.writableFinished || res.destroyed) executed();
    else res.once('close', executed);
    return;
  }
  const response = ctx.response as unknown as KoaResponseInternals;
  const body: unknown = ctx.body;
  if (EMPTY_STATUSES.has(ctx.status)) {
    if (body !== null && body !== undefined) ctx.body = null; // as Koa's respond: no body, no content headers
  } else if (body === null || body === undefined) {
    if (!response._explicitNullBody) {
      if (!response._explicitStatus) {
        // Nothing answered the request (Koa's default 404): an app's own not-found handling may still answer it
        // outside oncely, so nothing is stored and ctx is left as it is.
        await capture.failed(new Error('no middleware answered the request'));
        return;
      }
      // A status without a body: Koa sends the status message as text (its `respond`).
      const status = ctx.status;
      capture.hold(ctx.req.httpVersionMajor >= 2 ? String(status) : ctx.message || String(status));
      ctx.body = capture.body();
      ctx.type = 'text';
    }
  } else if (typeof body === 'string' || Buffer.isBuffer(body)) {
    // A handler may refill its own buffer (a pool) once it handed it over, while the store is asked before
    // anything is sent: what is stored and sent is the copy held.
    capture.hold(body);
    ctx.body = capture.body();
  } else {
    const source = streamOf(body);
    if (source === undefined) {
      // An object: Koa would send JSON.stringify(body). Sent as those bytes now, so the stored bytes are the sent ones.
      capture.hold(JSON.stringify(body));
      ctx.body = capture.body();
    } else {
      let rest: AsyncIterator<unknown> | undefined;
      try {
        rest = await capture.holdStream(source);
      } catch (error) {
        // Koa destroys the body stream when the client leaves: the handler ran, so the request is kept as executed
        // (a retry gets a 410), not released to run again. Otherwise the body failed before any of it was sent.
        if (res.destroyed || !ctx.writable) capture.cutShort();
        throw error;
      }
      if (rest !== undefined) {
        // Too big to keep: what was read, then the rest, streamed through. Koa destroys it when the response
        // closes without its end (the client left, or a middleware outside oncely replaced the body): cut short.
        ctx.body = capture.sendRest(rest, ctx.status, res.getHeaders(), () => void rest.return?.());
        return;
      }
      ctx.body = capture.body();
    }
  }
  const replacement = await capture.finished(ctx.status, res.getHeaders(), capture.body());
  if (replacement !== undefined) {
    // The transactional commit failed: nothing the handler wrote survived, so its answer must not be sent.
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    send(ctx, replacement);
  }
}

/** The body's bytes as an async iterator when it is a stream of some kind (Koa 3 takes all of these), else undefined. */
function streamOf(body: unknown): AsyncIterator<unknown> | undefined {
  if (body instanceof Readable) return body[Symbol.asyncIterator]();
  if (body instanceof ReadableStream) return (body as ReadableStream<Uint8Array>)[Symbol.asyncIterator]();
  if (body instanceof Blob) return body.stream()[Symbol.asyncIterator]();
  if (body instanceof Response) return (body.body ?? new Blob([]).stream())[Symbol.asyncIterator]();
  // Another Node stream implementation (Koa's own test: `typeof body.pipe === 'function'`).
  if (
    typeof body === 'object' &&
    body !== null &&
    typeof (body as { pipe?: unknown }).pipe === 'function' &&
    typeof (body as AsyncIterable<unknown>)[Symbol.asyncIterator] === 'function'
  ) {
    return (body as AsyncIterable<unknown>)[Symbol.asyncIterator]();
  }
  return undefined;
}
