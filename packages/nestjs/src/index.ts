/**
 * Idempotency-Key module for NestJS on Express and Fastify: import `IdempotencyModule` and mark handlers with
 * `@Idempotent()`, so a retried request takes effect once and its retries get the first response.
 *
 * @module @oncely/nestjs
 */
/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';
export { IdempotencyKey, Idempotent, type IdempotentSetting } from './decorators';
export { IdempotencyModule } from './idempotency.module';
export type {
  IdempotencyModuleAsyncOptions,
  IdempotencyModuleOptions,
  IdempotentOptions,
  IdempotentRequest,
} from './options';
