import { Idempotency, type IdempotencyContext, type IdempotencyOptions } from '@oncely/core';
import { HandlerFailure, respondOnce } from '@oncely/web';
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
        // A validator before us may have read the body through Hono's cache (which consumes the raw body); read
        // it from there then, otherwise from a clone, so that both c.req.json() and c.req.raw stay readable.
        readBody: () => (raw.bodyUsed ? c.req.arrayBuffer() : raw.clone().arrayBuffer()),
      },
      async (context) => {
        ran = true;
        if (context !== undefined) {
          held.add(raw);
          c.set('idempotencyKey', context.key);
          c.set('idempotency', context);
        }
        await next();
        // Hono turned an error of the handler into c.res through onError: send that, and release the key.
        if (context !== undefined && c.error !== undefined) return new HandlerFailure(c.error, c.res);
        return c.res;
      },
    );
    if (!ran) return response; // a replay or a problem: Hono sends what the middleware returns
    if (response !== c.res) c.res = response;
  };
}
