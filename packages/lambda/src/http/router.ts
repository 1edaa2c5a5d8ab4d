import type { Registration } from '@oncely/core/adapter';
import { HandlerFailure, registrationMade, respondOnce, toResponse } from '@oncely/web/adapter';
import type { Context } from 'aws-lambda';
import type { HttpEvent } from './events';
import {
  hold,
  LambdaHttp,
  type LambdaIdempotencyOptions,
  type NestedDecision,
  noteContext,
  takenFirst,
} from './wrap';

/**
 * The part of the Powertools Event Handler router's request context the middleware reads (`reqCtx`), typed here so
 * that `@aws-lambda-powertools/event-handler` stays optional: its web `Request`, the event, Lambda's context, and
 * the `Response` the handler and the middlewares after this one left.
 */
export interface RouterRequestContext {
  req: Request;
  event: HttpEvent;
  context: Context;
  res: Response;
}

/** A middleware of the Powertools Event Handler HTTP router (`app.use()`, or a route's `middleware`). */
export type RouterIdempotencyMiddleware = (args: {
  reqCtx: RouterRequestContext;
  next: () => Promise<unknown>;
}) => Promise<Response>;

/**
 * The same as `withIdempotency`, as a middleware of Powertools' Event Handler HTTP router
 * (`@aws-lambda-powertools/event-handler/http`): `app.use(routerIdempotency({ store }))` for every route, or
 * `app.post('/charges', [routerIdempotency({ store, required: true })], handler)` on one. A replay or a problem is
 * answered without running the handler; the `Response` the route produced is stored before it is returned. `scope`
 * and `fingerprint` get the router's request context; the handler reads its key with `currentIdempotency()` or
 * `idempotencyOf(reqCtx.event)`.
 */
export function routerIdempotency(
  options: LambdaIdempotencyOptions<RouterRequestContext> = {},
): RouterIdempotencyMiddleware {
  const lambda = new LambdaHttp<RouterRequestContext>(
    options,
    'routerIdempotency(options)',
    routerIdempotency,
  );
  const { engine, registration } = lambda;
  // Two of them on one route (app.use and the route's middleware) meet in respondOnce, as @oncely/web's do.
  registrationMade();
  return async function idempotencyMiddleware({ reqCtx, next }) {
    // The router's handler wrapped by `withIdempotency` or a Middy middleware, which took the event first.
    if (takenFirst(reqCtx.event)) {
      const nested = await nestedIn(lambda, reqCtx);
      if (nested?.refusal !== undefined) return toResponse(nested.refusal);
      if (nested !== undefined) {
        await nested.outer.run(next);
        return reqCtx.res;
      }
    }
    return respondOnce(
      engine,
      {
        request: reqCtx.req,
        target: reqCtx,
        log: lambda.log,
        lease: lambda.leaseOf(reqCtx.context),
        registration,
      },
      async (context) => {
        if (context === undefined) {
          await next();
          return reqCtx.res;
        }
        noteContext(reqCtx.event, context);
        // The route may hand the event to a `withIdempotency` or Middy handler of its own: it meets this mark, as
        // it would `withIdempotency`'s around it, and leaves the event to this one or refuses it.
        let refusal: { error: Error } | undefined;
        const finished = hold(reqCtx.event, {
          registration: registration as Registration<never>,
          // respondOnce runs this inside the execution: currentIdempotency() answers in the route already.
          outer: { run: (fn) => fn() },
          refused: async (error) => {
            refusal = { error };
          },
          invocation: undefined,
        });
        try {
          await next();
        } finally {
          finished();
        }
        // A registration nearer the handler refused the event: its answer is sent, the key released, nothing stored.
        return refusal === undefined ? reqCtx.res : new HandlerFailure(refusal.error, reqCtx.res);
      },
    );
  };
}

/** What `LambdaHttp.nested` says for a request this middleware covers, when a registration took its event first. */
async function nestedIn(
  lambda: LambdaHttp<RouterRequestContext>,
  reqCtx: RouterRequestContext,
): Promise<NestedDecision | undefined> {
  const { req, event } = reqCtx;
  const engine = lambda.engine;
  // A request this one does not cover (no key for its header, another method) is left to the outer one untouched.
  if (engine.passes(req.method, req.headers.has(engine.options.header))) return undefined;
  return lambda.nested(event, undefined);
}
