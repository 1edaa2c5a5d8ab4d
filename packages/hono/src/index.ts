import { Idempotency, type IdempotencyContext, type IdempotencyOptions } from '@oncely/core';
import { HandlerFailure, KnownBody, respondOnce } from '@oncely/web';
import type { Context, Env, MiddlewareHandler } from 'hono';

/**
 * Options of the Hono middleware: the shared options (contract §2); `scope` and `fingerprint` get Hono's `Context`.
 * Give your app's `Env` to type its variables there: `idempotency<AppEnv>({ scope: (c) => c.get('userId') })`.
 */
export type HonoIdempotencyOptions<E extends Env = Env> = IdempotencyOptions<Context<E>>;

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

// Requests an oncely middleware already holds, shared by every copy of this package: when two meet one request
// (app-wide and on a route), the first that takes it wins, as in the Express adapter.
const kHeld = Symbol.for('oncely.hono.held');
const globalHeld = globalThis as typeof globalThis & { [kHeld]?: WeakSet<Request> };
globalHeld[kHeld] ??= new WeakSet<Request>();
const held = globalHeld[kHeld];

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
  return async function idempotencyMiddleware(c, next) {
    const raw = c.req.raw;
    if (held.has(raw)) return next();
    let ran = false;
    const response = await respondOnce(
      engine,
      {
        request: raw,
        target: c,
        // Through Hono's body cache, as its validators read it: the handler's c.req.json() then parses the text
        // read here instead of reading the stream again. A clone (two more streams) cost ~20% of a request.
        readBody: (json) => (json ? c.req.text() : c.req.arrayBuffer()),
        headers: nodeHeaders(c),
      },
      async (context) => {
        ran = true;
        if (context === undefined) {
          await next();
          return c.res;
        }
        held.add(raw);
        c.set('idempotencyKey', context.key);
        c.set('idempotency', context);
        const known = watchBody(c);
        await next();
        // Hono turned an error of the handler into c.res through onError: send that, and release the key.
        if (c.error !== undefined) return new HandlerFailure(c.error, c.res);
        const res = c.res;
        return known.response === res && known.body !== undefined ? new KnownBody(res, known.body) : res;
      },
    );
    if (!ran) return response; // a replay or a problem: Hono sends what the middleware returns
    if (response !== c.res) {
      // Unset first: over an existing response, Hono's setter re-wraps the new one (a Response and a stream more)
      // to copy the old one's headers, which \`response\` already has.
      c.res = undefined as unknown as Response;
      c.res = response;
    }
  };
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

const encoder = new TextEncoder();
// Where Buffer exists (Node, Bun), a short text's bytes are a slice of its shared pool, as the other adapters' are:
// TextEncoder gives each its own ArrayBuffer and backing store. Making a record's body and holding the last
// 10,000 (as MemoryStore does) took 1.1-2.1 µs of CPU per record with TextEncoder, 0.27-0.42 µs with Buffer.from
// (1M records, three rounds, Node 20, 2026-11-24).
const utf8: (text: string) => Uint8Array =
  typeof Buffer === 'function' ? (text) => Buffer.from(text) : (text) => encoder.encode(text);

/**
 * Notes the body a handler gives `c.json`, `c.text` or `c.body` as text or bytes, with the Response made of it.
 * When that Response is the one sent, its bytes are stored without reading its stream: on @hono/node-server a
 * Response made from a string is written straight to the socket, and reading its stream first builds an undici
 * Response and two web streams (most of oncely's cost per request on Hono, docs/benchmarks.md).
 */
function watchBody(c: Context): { response: Response | undefined; body: Uint8Array | undefined } {
  const known: { response: Response | undefined; body: Uint8Array | undefined } = {
    response: undefined,
    body: undefined,
  };
  const note = (response: Response, body: Uint8Array | undefined): Response => {
    known.response = response;
    known.body = body;
    return response;
  };
  const { json, text, body } = c;
  c.json = ((object: unknown, ...rest: unknown[]) =>
    // Stringified here too, at the same moment, so the stored bytes are the ones sent.
    note(
      (json as (...a: unknown[]) => Response)(object, ...rest),
      utf8(JSON.stringify(object)),
    )) as typeof c.json;
  c.text = ((value: string, ...rest: unknown[]) =>
    note((text as (...a: unknown[]) => Response)(value, ...rest), utf8(value))) as typeof c.text;
  c.body = ((data: unknown, ...rest: unknown[]) =>
    note(
      (body as (...a: unknown[]) => Response)(data, ...rest),
      typeof data === 'string'
        ? utf8(data)
        : data instanceof Uint8Array
          ? data
          : data instanceof ArrayBuffer
            ? new Uint8Array(data)
            : data === null
              ? new Uint8Array(0)
              : undefined,
    )) as typeof c.body;
  return known;
}
