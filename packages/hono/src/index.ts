/**
 * Idempotency-Key middleware for Hono, on any runtime Hono runs on: a retried request takes effect once and its
 * retries get the first response.
 *
 * @module @oncely/hono
 */
import {
  scopeByHeader as headerScope,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type ScopeByHeaderOptions,
  type StoredResponse,
} from '@oncely/core';
import { nestedEngine, type Registration, registrationOf } from '@oncely/core/adapter';
import { HandlerFailure, KnownBody, registrationMade, respondOnce, toResponse } from '@oncely/web/adapter';
import type { Context, Env, MiddlewareHandler } from 'hono';

/**
 * Options of the Hono middleware: the shared options (docs/options.md); `scope` and `fingerprint` get Hono's `Context`.
 * Give your app's `Env` to type its variables there: `idempotency<AppEnv>({ scope: (c) => c.get('userId') })`.
 */
export type HonoIdempotencyOptions<E extends Env = Env> = IdempotencyOptions<Context<E>>;

export type { ScopeByHeaderOptions };

/**
 * The scope the docs recommend for API keys, for Hono, whose `scope` gets the `Context`:
 * `idempotency({ scope: scopeByHeader('authorization', { secret }) })`. The scope is `<header>:` and an HMAC-SHA256
 * of the header's value keyed by `secret` (`@oncely/core`'s `scopeByHeader`, on `c.req.raw`).
 */
export function scopeByHeader<E extends Env = Env>(
  header: string,
  options: ScopeByHeaderOptions,
): (c: Context<E>) => string {
  const scope = headerScope(header, options);
  return (c) => scope(c.req.raw);
}

/** What the middleware sets on the context of a covered request: `c.get('idempotencyKey')`. */
export interface IdempotencyVariables {
  /** The Idempotency-Key this request runs under (unquoted); `undefined` when oncely does not cover the request. */
  idempotencyKey: string | undefined;
  /** The key and, in transactional mode, the transaction's database client; `undefined` likewise. */
  idempotency: IdempotencyContext | undefined;
}

declare module 'hono' {
  // Typed `c.get('idempotencyKey')` in every handler, as Hono's own middlewares (requestId) do.
  interface ContextVariableMap extends IdempotencyVariables {}
}

// The registration of each oncely middleware, to find them among the handlers Hono matched for a request.
const registrations = new WeakMap<object, Registration<Context>>();
// How many were made: with one, no request can meet two, and the search is skipped.
let made = 0;

/**
 * Hono middleware: `app.use('/api/*', idempotency())` covers every POST/PUT/PATCH under `/api`; on one route,
 * `app.post('/charges', idempotency({ required: true }), handler)`. The handler's response (status, headers, body
 * bytes, streamed or not) is stored before it is sent; a retry gets it back with `Idempotent-Replayed: true`.
 * Options are checked here, once.
 */
export function idempotency<E extends Env = Env>(
  options: HonoIdempotencyOptions<E> = {},
): MiddlewareHandler<E> {
  const engine = new Idempotency<Context<E>>(options);
  const registration = registrationOf(engine, options, idempotency, 'idempotency()');
  made++;
  registrationMade();
  const middleware: MiddlewareHandler<E> = async function idempotencyMiddleware(c, next) {
    const raw = c.req.raw;
    const handling = made > 1 ? nearest(c, registration as Registration<Context>) : engine;
    // A registration nearer the route handles this request.
    if (handling === undefined) return next();
    let ran = false;
    const response = await respondOnce(
      handling as Idempotency<Context<E>>,
      {
        request: raw,
        target: c,
        // Through Hono's body cache, as its validators read it: the handler's c.req.json() then parses the text
        // read here instead of reading the stream again, and no clone (two more streams) is made.
        readBody: (json) => (json ? c.req.text() : c.req.arrayBuffer()),
        headers: nodeHeaders(c),
        // Functions of the context, not closures over it: nothing more allocated per request.
        clientGone,
        respond: withOuterHeaders,
        registration: registration as Registration<Context<E>>,
      },
      async (context) => {
        ran = true;
        if (context === undefined) {
          await next();
          return c.res;
        }
        c.set('idempotencyKey', context.key);
        c.set('idempotency', context);
        const known = watchBody(c);
        await next();
        // Hono turned an error of the handler into c.res through onError: send that, and release the key.
        if (c.error !== undefined) return new HandlerFailure(c.error, c.res);
        const res = c.res;
        if (known.response !== res || known.body === undefined) return res;
        return new KnownBody(res, known.body);
      },
    );
    if (!ran) {
      // A replay or a problem, made by withOuterHeaders: set as c.res without Hono's merge (done already; its
      // re-wrap would turn the body into a stream, far slower to send than the bytes themselves).
      c.res = undefined as unknown as Response;
      c.res = response;
      return;
    }
    if (response !== c.res) {
      // Unset first: over an existing response, Hono's setter re-wraps the new one (a Response and a stream more)
      // to copy the old one's headers, which \`response\` already has.
      c.res = undefined as unknown as Response;
      c.res = response;
    }
  };
  registrations.set(middleware, registration as Registration<Context>);
  return middleware;
}

/**
 * Hono knows every handler of a request before the first runs: when oncely middlewares are among them (app-wide,
 * on a sub-app, on the route), the one nearest the route that covers the request handles it, with its options
 * over the outer ones' (as a route's options are over a plugin's on Fastify), and the others step aside. Only
 * those before the first handler that ends the request count: the ones matched after it never run. Gives the
 * engine this middleware handles the request with, or `undefined` when another one handles it.
 */
function nearest(c: Context, own: Registration<Context>): Idempotency<Context> | undefined {
  // c.req.matchedRoutes, not hono/route's matchedRoutes(c): that helper needs Hono 4.8, the peer range is ^4.0.0,
  // and both build the same array. Read once per request, and only when two registrations exist.
  const req = c.req as { matchedRoutes?: unknown; routeIndex?: unknown };
  let routes: unknown;
  try {
    routes = req.matchedRoutes;
  } catch {
    return own.engine;
  }
  const index = req.routeIndex;
  if (!Array.isArray(routes) || typeof index !== 'number') return own.engine;
  const chain: Registration<Context>[] = [];
  let position = -1;
  for (let i = 0; i < routes.length; i++) {
    const handler = innermost((routes[i] as { handler?: unknown } | undefined)?.handler);
    const registration = registrations.get(handler as object);
    if (registration === undefined) {
      // A handler after this middleware answers the request: nothing matched after it runs.
      if (i > index && endsRequest(handler)) break;
      continue;
    }
    if (i === index) position = chain.length;
    chain.push(registration);
  }
  // Alone, or not found where Hono says this handler is: its own options.
  if (chain.length < 2 || position === -1) return own.engine;
  const engines: Idempotency<Context>[] = [];
  let layered: Idempotency<Context> | undefined;
  for (const registration of chain) {
    layered = layered === undefined ? registration.engine : nestedEngine(layered, registration);
    engines.push(layered);
  }
  const method = c.req.method;
  for (let i = engines.length - 1; i >= 0; i--) {
    if ((engines[i] as Idempotency<Context>).covers(method)) return i === position ? engines[i] : undefined;
  }
  return engines[position];
}

/** A matched handler without the wrappers Hono puts around a sub-app's handlers. */
function innermost(handler: unknown): unknown {
  let h = handler;
  // app.route() wraps a sub-app's handlers when the sub-app has its own error handler (hono's COMPOSED_HANDLER).
  for (let depth = 0; typeof h === 'function' && depth < 8; depth++) {
    const wrapped = (h as { __COMPOSED_HANDLER?: unknown }).__COMPOSED_HANDLER;
    if (wrapped === undefined) return h;
    h = wrapped;
  }
  return h;
}

/**
 * Whether a matched handler ends the request instead of calling `next`: one that does not take `next`, as Hono's
 * own route inspection (hono/dev) tells a handler from a middleware.
 */
function endsRequest(handler: unknown): boolean {
  return typeof handler !== 'function' || handler.length < 2;
}

/**
 * The headers of Node's `IncomingMessage` when the app runs on @hono/node-server (`c.env.incoming`), else
 * `undefined`. Read there, the first execution skips building an undici `Headers` from the raw headers and copying
 * it into a record (`newHeadersFromIncoming`, `append`, `toSortedArray` in the profile of docs/frameworks/hono.md).
 */
function nodeHeaders(c: Context): Readonly<Record<string, string | string[] | undefined>> | undefined {
  const incoming = (c.env as { incoming?: { headers?: unknown; rawHeaders?: unknown } } | undefined)
    ?.incoming;
  if (incoming === undefined || !Array.isArray(incoming.rawHeaders)) return undefined;
  const headers = incoming.headers;
  return typeof headers === 'object' && headers !== null
    ? (headers as Readonly<Record<string, string | string[] | undefined>>)
    : undefined;
}

/**
 * A replay or a problem answer with the headers that middleware outside oncely set on this request before it
 * (`c.header()`: a request id, a session cookie; CORS writes `c.res.headers`): they win over stored ones of the same
 * name, as Hono's own merge into a response does (`Content-Type` excepted; `Set-Cookie` only theirs, since a stored
 * record never has one), so a replay carries this request's id, not the first one's. Reading `c.res` is how Hono
 * gives them (it makes a response of the prepared headers).
 */
function withOuterHeaders(answer: StoredResponse, c: Context): Response {
  const outer = c.res.headers;
  let headers: Record<string, string | string[]> | undefined;
  for (const [name, value] of outer) {
    if (name === 'content-type') continue;
    headers ??= { ...answer.headers };
    headers[name] = name === 'set-cookie' ? outer.getSetCookie() : value;
  }
  return toResponse(headers === undefined ? answer : { ...answer, headers });
}

/**
 * Whether the client has gone: Node's response destroyed on @hono/node-server (`c.env.outgoing`), else the
 * request's signal aborted. On @hono/node-server the signal would cost an `AbortController` per request.
 */
function clientGone(c: Context): boolean {
  const outgoing = (c.env as { outgoing?: { destroyed?: unknown } } | undefined)?.outgoing;
  if (outgoing !== undefined && typeof outgoing.destroyed === 'boolean') return outgoing.destroyed;
  return c.req.raw.signal?.aborted === true;
}

const encoder = new TextEncoder();
// Where Buffer exists (Node, Bun), a short text's bytes are a slice of its shared pool, as the other adapters' are:
// TextEncoder gives each its own ArrayBuffer and backing store, several times dearer for records held by the
// thousand.
const utf8: (text: string) => Uint8Array =
  typeof Buffer === 'function' ? (text) => Buffer.from(text) : (text) => encoder.encode(text);

/**
 * Notes the body a handler gives `c.json`, `c.text` or `c.body` as text or bytes, with the Response made of it.
 * When that Response is the one sent, its bytes are stored without reading its stream: on @hono/node-server a
 * Response made from a string is written straight to the socket, and reading its stream first builds an undici
 * Response and two web streams (most of oncely's cost per request on Hono, docs/benchmarks.md). Anything else (a
 * stream, a value that is not text) leaves the body unknown, and its stream is read as for any Response. This,
 * with its copy of a handler's buffer, is Hono's own capture: the rest is `@oncely/web`'s, since Hono answers with a
 * fetch `Response` rather than writing to a Node response.
 */
function watchBody(c: Context): KnownResponse {
  const known: KnownResponse = { response: undefined, body: undefined };
  const note = (response: Response, body: Uint8Array | undefined): Response => {
    known.response = response;
    known.body = body;
    return response;
  };
  // Hono's own methods, called as they are; typed loosely, since each is overloaded.
  const { json, text, body } = c as unknown as Record<
    'json' | 'text' | 'body',
    (...a: unknown[]) => Response
  >;
  c.json = ((object: unknown, ...rest: unknown[]) => {
    // Stringified once: Hono's json gets a snapshot parsed from this very text, whose serialisation is the same
    // text, so a toJSON or getter that answers differently each time cannot make the stored bytes differ from
    // those sent. undefined (c.json(undefined), a function) has no text: Hono's answer is read as it is.
    const textOf = JSON.stringify(object);
    if (textOf === undefined) return note(json(object, ...rest), undefined);
    return note(json(JSON.parse(textOf), ...rest), utf8(textOf));
  }) as typeof c.json;
  c.text = ((value: unknown, ...rest: unknown[]) =>
    note(text(value, ...rest), typeof value === 'string' ? utf8(value) : undefined)) as typeof c.text;
  c.body = ((data: unknown, ...rest: unknown[]) => {
    if (typeof data === 'string') return note(body(data, ...rest), utf8(data));
    if (data === null) return note(body(data, ...rest), EMPTY);
    if (data instanceof Uint8Array || data instanceof ArrayBuffer) {
      // The handler's own buffer, which it may refill once it has handed it over (a pool): the response is made
      // of a copy of it as it was handed over, and that copy is stored, since the store is asked before it is sent.
      const copy = data instanceof ArrayBuffer ? new Uint8Array(data.slice(0)) : new Uint8Array(data);
      return note(body(copy, ...rest), copy);
    }
    return note(body(data, ...rest), undefined);
  }) as typeof c.body;
  return known;
}

interface KnownResponse {
  response: Response | undefined;
  body: Uint8Array | undefined;
}

const EMPTY = new Uint8Array(0);
