/**
 * Idempotency-Key for any web-standard fetch handler, `(Request) => Response`: Node, Bun, Deno, Next.js route
 * handlers. `withIdempotency(handler, options)` makes a retried request take effect once.
 *
 * @module @oncely/web
 */
import {
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  InvalidValueError,
} from '@oncely/core';
import { registrationOf } from '@oncely/core/adapter';
import { registrationMade, respondOnce } from './respond';

/** Options of `withIdempotency`: the shared options (docs/options.md); `scope` and `fingerprint` get the `Request`. */
export type WebIdempotencyOptions = IdempotencyOptions<Request>;

/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';

/** A web-standard fetch handler; extra arguments (Cloudflare's `env`, Next.js's route context) pass through. */
export type FetchHandler<Args extends unknown[] = []> = (
  request: Request,
  ...args: Args
) => Response | Promise<Response>;

// The context of each covered request, for the handler to read (idempotencyOf). A WeakMap: a Request may be
// frozen or a platform object that refuses new properties, and nothing must outlive the request.
const contexts = new WeakMap<Request, IdempotencyContext>();

/** The key (and, in transactional mode, the transaction's client) of a request oncely covers; else `undefined`. */
export function idempotencyOf(request: Request): IdempotencyContext | undefined {
  return contexts.get(request);
}

/** The Idempotency-Key a covered request runs under (unquoted), or `undefined`. */
export function idempotencyKeyOf(request: Request): string | undefined {
  return contexts.get(request)?.key;
}

/**
 * Wraps a fetch handler: `export const POST = withIdempotency(async (request) => Response.json(...))`. The first
 * request with a key runs the handler, and its status, headers and body bytes are stored before the response is
 * returned; a retry gets them back with `Idempotent-Replayed: true`. Options are checked here, once.
 */
export function withIdempotency<Args extends unknown[] = []>(
  handler: FetchHandler<Args>,
  options: WebIdempotencyOptions = {},
): (request: Request, ...args: Args) => Promise<Response> {
  if (typeof handler !== 'function') {
    throw new InvalidValueError(
      'oncely: withIdempotency(handler, options) needs the fetch handler as its first argument.',
    );
  }
  const engine = new Idempotency<Request>(options);
  const registration = registrationOf(engine, options, withIdempotency, 'withIdempotency()');
  registrationMade();
  return function idempotentHandler(request: Request, ...args: Args): Promise<Response> {
    return respondOnce(engine, { request, target: request, registration }, async (context) => {
      if (context !== undefined) contexts.set(request, context);
      return handler(request, ...args);
    });
  };
}
