// HTTP events: API Gateway REST (v1), HTTP API (v2), Function URLs and ALB, as a wrapper, a Middy middleware and a
// middleware of Powertools' Event Handler HTTP router.
export type { HttpEvent, ResultFor } from './http/events';
export { idempotencyMiddleware } from './http/middy';
export { routerIdempotency } from './http/router';
export {
  idempotencyOf,
  type LambdaHttpHandler,
  type LambdaIdempotencyOptions,
  withIdempotency,
} from './http/wrap';
