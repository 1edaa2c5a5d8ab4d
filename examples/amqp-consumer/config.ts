// What the consumer and the publisher share: where RabbitMQ and Redis are, and the queue's name.
export const amqpUrl = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
export const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
export const queue = process.env.QUEUE ?? 'oncely-example-orders';
export const prefix = process.env.ONCELY_PREFIX ?? 'oncely-example:';
/** Where RabbitMQ puts messages the consumer gives up on (a queue without one would drop them). */
export const deadLetterExchange = `${queue}.dead-letter`;
export const deadLetterQueue = `${queue}.dead-letter`;

/** The message for a service that is not there: which one, where, and how to start it; no stack trace. */
export function unreachable(service: string, where: string, composeName: string, error: unknown): string {
  const reason = error instanceof Error ? error.message : String(error);
  return (
    `${service} is not reachable at ${where} (${reason}). Start it: bash scripts/services.sh, ` +
    `or docker compose up -d ${composeName}.`
  );
}
