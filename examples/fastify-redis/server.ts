// Fastify 5 on RedisStore: the idempotency records live in Redis, so every instance of the app shares them and a
// retry that lands on another instance is still replayed. Run from the repository root:
//   npm run example:fastify-redis
import { randomUUID } from 'node:crypto';
import { idempotencyPlugin } from '@oncely/fastify';
import { RedisStore } from '@oncely/redis';
import Fastify from 'fastify';
import Redis from 'ioredis';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const port = Number(process.env.PORT ?? 3001);
const prefix = process.env.ONCELY_PREFIX ?? 'oncely-example:';

// Fail fast while Redis is down (docs/stores/redis.md): a request gets 503 in 0.5 s instead of hanging.
const client = new Redis(redisUrl, {
  lazyConnect: true,
  commandTimeout: 500,
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
});
let lastError: Error | undefined;
client.on('error', (error) => {
  lastError = error;
  if (client.status === 'ready' || client.status === 'reconnecting') console.error(`redis: ${error.message}`);
});
try {
  await client.connect();
} catch (error) {
  console.error(
    `Redis is not reachable at ${redisUrl} (${(lastError ?? (error as Error)).message}). ` +
      'Start it: bash scripts/services.sh, or docker compose up -d redis; or point REDIS_URL at yours.',
  );
  process.exit(1);
}

const fastify = Fastify();
await fastify.register(idempotencyPlugin, { store: new RedisStore({ client, prefix }) });

let payments = 0;
fastify.post('/payments', { config: { idempotency: { required: true } } }, async (request, reply) => {
  const body = (request.body ?? {}) as { amount?: unknown };
  const id = `pay_${++payments}_${randomUUID().slice(0, 8)}`;
  // One line per real execution: a replay does not print it.
  console.log(`payment ${id} created (key ${request.idempotencyKey}, instance on port ${address().port})`);
  reply.code(201);
  return { id, amount: typeof body.amount === 'number' ? body.amount : null };
});

const address = () => fastify.server.address() as { port: number };

try {
  await fastify.listen({ host: '127.0.0.1', port });
} catch (error) {
  console.error(`Could not listen on port ${port}: ${(error as Error).message}. Try PORT=3011.`);
  await client.quit();
  process.exit(1);
}

const url = `http://127.0.0.1:${address().port}`;
const key = `pay-${randomUUID()}`;
const curl = `curl -i -X POST ${url}/payments -H 'Idempotency-Key: ${key}' -H 'Content-Type: application/json' -d '{"amount":1000}'`;
console.log(`oncely example listening on ${url} (Fastify 5, RedisStore at ${redisUrl}, prefix ${prefix}). Ctrl+C to stop.

Send the same payment twice; the second answer is the stored 201, with "Idempotent-Replayed: true", and this
terminal prints one "payment ... created" line, not two:

   ${curl}
   ${curl}

Start a second instance (PORT=3011 npm run example:fastify-redis) and send the same command to port 3011:
it is replayed there too, because both instances keep their records in the same Redis.
`);

const stop = async () => {
  await fastify.close();
  await client.quit();
  process.exit(0);
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
