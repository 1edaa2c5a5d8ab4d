// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles.
import Fastify from 'fastify';
import { type FastifyIdempotencyOptions, type IdempotencyRouteConfig, idempotencyPlugin } from '../src/index';

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

export async function optionsDeclaredBeforeUseNeedAsConstOrSatisfies(): Promise<void> {
  const app = Fastify();
  const widened = { ttl: '24h' };
  // @ts-expect-error the declaration widened '24h' to string
  await app.register(idempotencyPlugin, widened);
  const pluginOptions = { ttl: '24h', lockTimeout: '30s' } satisfies FastifyIdempotencyOptions;
  await app.register(idempotencyPlugin, pluginOptions);
  const perRouteWidened = { ttl: '1h' };
  // @ts-expect-error the declaration widened '1h' to string
  app.post('/g', { config: { idempotency: perRouteWidened } }, async () => 'ok');
  const perRoute = { ttl: '1h' } as const;
  app.post('/h', { config: { idempotency: perRoute } }, async () => 'ok');
  // An inline misspelt option compiles (Fastify types config from the literal) and throws when the route is added.
  app.post('/i', { config: { idempotency: { ttll: '1h', requried: true } } }, async () => 'ok');
}
