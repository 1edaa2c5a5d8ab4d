// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles.
import Fastify from 'fastify';
import { type IdempotencyRouteConfig, idempotencyPlugin } from '../src/index';

export async function routeConfig(): Promise<void> {
  const app = Fastify();
  await app.register(idempotencyPlugin, { ttl: '24h' });
  app.post('/a', { config: { idempotency: { ttl: '1h', required: true } } }, async () => 'ok');
  app.post('/b', { config: { idempotency: false } }, async () => 'ok');
  app.post(
    '/c',
    { config: { idempotency: { ttl: '1h' } satisfies IdempotencyRouteConfig } },
    async () => 'ok',
  );
  app.post('/d', { config: { idempotency: true satisfies IdempotencyRouteConfig } }, async () => 'ok');

  // @ts-expect-error a misspelt option is caught once the literal is checked against IdempotencyRouteConfig
  const misspelt = { ttll: '1h' } satisfies IdempotencyRouteConfig;
  app.post('/e', { config: { idempotency: misspelt } }, async () => 'ok');
  // @ts-expect-error not a duration
  app.post('/f', { config: { idempotency: { ttl: '1 day' } } }, async () => 'ok');
  // @ts-expect-error not a duration
  await app.register(idempotencyPlugin, { lockTimeout: 'a minute' });
}
