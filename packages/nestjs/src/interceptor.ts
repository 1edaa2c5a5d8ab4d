import {
  type CallHandler,
  type ExecutionContext,
  Inject,
  Injectable,
  type NestInterceptor,
} from '@nestjs/common';
import { noteHandlerError as noteExpressError } from '@oncely/express';
import { noteHandlerError as noteFastifyError } from '@oncely/fastify';
import type { Request, Response } from 'express';
import type { FastifyRequest } from 'fastify';
import { catchError, Observable, type Subscription, throwError } from 'rxjs';
import { type ExpressRoute, IdempotencyRoutes } from './routes';

/**
 * Nest catches a handler's error itself and hands it to its exception filters, which write the answer: Express's
 * `next(err)` and Fastify's onError, through which the adapters learn that a handler failed, never see it. Told
 * here instead, so the key is released and the filter's answer (a 400 as much as a 500) is sent, not stored.
 */
function noteFailure(request: object, response: object, error: unknown): void {
  if (!noteExpressError(response as Response, error)) noteFastifyError(request as FastifyRequest, error);
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
    if (platform === 'fastify') return handled(next, request, response);
    const route = this.#routes.expressRoute(context.getClass(), context.getHandler());
    if (route === null) return next.handle();
    return runExpress(route, request as Request, response as Response, next);
  }
}

function handled(next: CallHandler, request: object, response: object): Observable<unknown> {
  return next.handle().pipe(
    catchError((error: unknown) => {
      noteFailure(request, response, error);
      return throwError(() => error);
    }),
  );
}

/**
 * Runs the middleware with the real request and response, and the handler as its `next`. When oncely answers
 * itself (a replay, a 409, a problem), `next` is never called and the Observable never emits: Nest then has
 * nothing to send, and the answer oncely sent is the only one.
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
    const held = holdHeaders(response, route.decoratorHeaders);
    route.middleware(request, response, (error?: unknown) => {
      if (continued) return;
      continued = true;
      restoreHeaders(response, held);
      // The engine itself failed: Nest's filters answer, as for any error.
      if (error !== undefined) return subscriber.error(error);
      handler = handled(next, request, response).subscribe(subscriber);
    });
    return () => handler?.unsubscribe();
  });
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
