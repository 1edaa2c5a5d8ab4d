import {
  type CallHandler,
  type ExecutionContext,
  Inject,
  Injectable,
  type NestInterceptor,
  RequestTimeoutException,
  StreamableFile,
} from '@nestjs/common';
import {
  noteHandlerAbandoned as abandonExpress,
  noteHandlerError as noteExpressError,
} from '@oncely/express';
import {
  noteHandlerAbandoned as abandonFastify,
  noteHandlerError as noteFastifyError,
} from '@oncely/fastify';
import type { Request, Response } from 'express';
import type { FastifyRequest } from 'fastify';
import { catchError, Observable, type Subscription, TimeoutError, throwError } from 'rxjs';
import { enteredRequests } from './entered';
import { type ExpressRoute, IdempotencyRoutes } from './routes';

/**
 * Nest catches a handler's error itself and hands it to its exception filters, which write the answer: Express's
 * `next(err)` and Fastify's onError, through which the adapters learn that a handler failed, never see it. Told
 * here instead, so the key is released and the filter's answer (a 400 as much as a 500) is sent, not stored.
 */
function noteFailure(request: object, response: object, error: unknown): void {
  if (isTimeout(error)) noteAbandoned(request, response);
  else if (!noteExpressError(response as Response, error)) noteFastifyError(request as FastifyRequest, error);
}

/** The handler may still be running: its key must not be released, only left to lapse. */
function noteAbandoned(request: object, response: object): void {
  if (!abandonExpress(response as Response)) abandonFastify(request as FastifyRequest);
}

/**
 * A timeout interceptor's error (rxjs `TimeoutError`, or the `RequestTimeoutException` Nest's docs map it to):
 * the handler did not fail, it is still running, so releasing its key would let a retry run beside it.
 */
function isTimeout(error: unknown): boolean {
  return error instanceof TimeoutError || error instanceof RequestTimeoutException;
}

/**
 * The enhancer that runs `@oncely/express`'s middleware on the Express platform, where a Nest middleware would
 * not know the handler. Global (APP_INTERCEPTOR), so it runs after guards, before controller and handler
 * interceptors and pipes. On Fastify the plugin's hooks do that work, and this only notes failures.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  readonly #routes: IdempotencyRoutes;

  constructor(@Inject(IdempotencyRoutes) routes: IdempotencyRoutes) {
    this.#routes = routes;
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const platform = this.#routes.platform;
    if (platform === undefined || context.getType() !== 'http') return next.handle();
    const http = context.switchToHttp();
    const request = http.getRequest<object>();
    const response = http.getResponse<object>();
    if (platform === 'fastify') {
      enteredRequests.add(request);
      return handled(next, request, response);
    }
    const route = this.#routes.expressRoute(context.getClass(), context.getHandler());
    if (route === null) return next.handle();
    return runExpress(route, request as Request, response as Response, next);
  }
}

/**
 * The handler's Observable, telling the adapter when the handler failed: it threw, a `StreamableFile` it returned
 * failed while streaming (Nest's error handler then answers with the headers oncely still holds), or Nest gave it
 * up before it settled (unsubscribed: the client left), after which nothing would end the response through oncely.
 */
function handled(next: CallHandler, request: object, response: object): Observable<unknown> {
  return new Observable<unknown>((subscriber) => {
    let settled = false;
    const subscription = next
      .handle()
      .pipe(
        catchError((error: unknown) => {
          settled = true;
          noteFailure(request, response, error);
          return throwError(() => error);
        }),
      )
      .subscribe({
        next: (value) => {
          if (value instanceof StreamableFile) {
            value.getStream().once('error', (error: unknown) => noteFailure(request, response, error));
          }
          subscriber.next(value);
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          settled = true;
          subscriber.complete();
        },
      });
    return () => {
      subscription.unsubscribe();
      if (!settled) noteAbandoned(request, response);
    };
  });
}

/**
 * Runs the middleware with the real request and response, and the handler as its `next`. When oncely answers
 * itself (a replay, a 409, a problem), `next` is never called and the handler never runs: once that answer is
 * out, the Observable emits `undefined` and completes, so interceptors outside this one finish as for any
 * request (a timeout interceptor's timer stops), and what Nest then sends for it goes nowhere (`send` and `json`
 * of that response do nothing any more): the answer oncely sent is the only one.
 */
function runExpress(
  route: ExpressRoute,
  request: Request,
  response: Response,
  next: CallHandler,
): Observable<unknown> {
  return new Observable<unknown>((subscriber) => {
    let handler: Subscription | undefined;
    let continued = false;
    const answeredByOncely = (): void => {
      if (continued) return;
      continued = true;
      response.send = sentAlready;
      response.json = sentAlready;
      subscriber.next(undefined);
      subscriber.complete();
    };
    response.once('finish', answeredByOncely);
    response.once('close', answeredByOncely);
    const held = holdHeaders(response, route.decoratorHeaders);
    route.middleware(request, response, (error?: unknown) => {
      if (continued) return;
      continued = true;
      response.off('finish', answeredByOncely);
      response.off('close', answeredByOncely);
      restoreHeaders(response, held);
      // The engine itself failed: Nest's filters answer, as for any error.
      if (error !== undefined) return subscriber.error(error);
      handler = handled(next, request, response).subscribe(subscriber);
    });
    return () => handler?.unsubscribe();
  });
}

/** `send`/`json` of a response oncely answered itself: Nest's reply for it must not write a second one. */
function sentAlready(this: Response): Response {
  return this;
}

type HeldHeaders = [name: string, value: number | string | string[]][] | undefined;

function holdHeaders(response: Response, names: readonly string[]): HeldHeaders {
  if (names.length === 0) return undefined;
  const held: NonNullable<HeldHeaders> = [];
  for (const name of names) {
    const value = response.getHeader(name);
    if (value === undefined) continue;
    held.push([name, value]);
    response.removeHeader(name);
  }
  return held;
}

function restoreHeaders(response: Response, held: HeldHeaders): void {
  if (held === undefined || response.headersSent) return;
  for (const [name, value] of held) response.setHeader(name, value);
}
