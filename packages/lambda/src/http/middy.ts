import type { Execution } from '@oncely/core/adapter';
import type { Context } from 'aws-lambda';
import type { EventRequest, HttpEvent, ResultFor } from './events';
import { LambdaHttp, type LambdaIdempotencyOptions } from './wrap';

/**
 * The part of Middy's request object the middleware reads and sets (Middy 7's `Request`), typed here so that
 * `@middy/core` stays optional: what `middy().use()` hands each middleware.
 */
export interface MiddyRequest<E = HttpEvent, R = unknown> {
  event: E;
  context: Context;
  response: R | ResultFor<E> | null | undefined;
  error: unknown;
}

/** A Middy middleware object (`before`, `after`, `onError`), as `middy().use()` takes it. */
export interface IdempotencyMiddyMiddleware<E = HttpEvent, R = unknown> {
  before: (request: MiddyRequest<E, R>) => Promise<ResultFor<E> | undefined>;
  after: (request: MiddyRequest<E, R>) => Promise<void>;
  onError: (request: MiddyRequest<E, R>) => Promise<void>;
}

interface Running {
  /** The event as `before` saw it (a middleware may replace `request.event` on the way). */
  event: object;
  execution: Execution;
  request: EventRequest;
}

/**
 * The same as `withIdempotency`, as a Middy middleware: `middy(handler).use(idempotencyMiddleware({ store }))`.
 * `before` answers a replay or a problem at once (Middy's early response: the handler does not run), `after`
 * stores the response the handler left, `onError` releases the key. Use it last: Middy runs no further middleware
 * after an early response, so one used after this one that answers early leaves the key held until its lease ends,
 * and no other middleware's `after` runs on a replay. The handler reads its key with `idempotencyOf(event)`: Middy
 * runs it outside the middleware, so `currentIdempotency()` does not reach it.
 */
export function idempotencyMiddleware<E extends HttpEvent = HttpEvent, R = unknown>(
  options: LambdaIdempotencyOptions<E> = {},
): IdempotencyMiddyMiddleware<E, R> {
  const lambda = new LambdaHttp<E>(options, 'idempotencyMiddleware(options)', idempotencyMiddleware);
  // Middy makes one request object per invocation, handed to each phase.
  const running = new WeakMap<object, Running>();
  return {
    async before(request) {
      const read = lambda.request(request.event);
      // Another registration that took the event first (one around Middy, or this one used twice): `outer`, and the
      // handler runs under it; Middy runs the handler itself, so currentIdempotency() does not reach it there.
      const { result, execution } = await lambda.decide(request.event, read, request.context, request);
      if (execution !== undefined) running.set(request, { event: request.event, execution, request: read });
      return result;
    },
    async after(request) {
      const held = running.get(request);
      if (held === undefined) return;
      running.delete(request);
      request.response = await lambda.settle(held.event, held.execution, held.request, request.response);
    },
    async onError(request) {
      const held = running.get(request);
      if (held === undefined) return;
      running.delete(request);
      await lambda.failed(held.event, held.execution, request.error);
    },
  };
}
