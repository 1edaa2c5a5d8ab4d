/**
 * @services postgres rabbitmq
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { startAppProcess } from '@oncely/testing';
import { connect } from 'amqplib';
import { PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

// Issue 5's hardest crash: a consumer killed AFTER its side effect committed and BEFORE its ack. With the effect
// and the record in one PostgreSQL transaction, the redelivery finds the record: exactly one effect.
jest.setTimeout(120_000);

const amqpUrl = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const queue = `oncely-tx-${randomUUID()}`;
const db = testSchema();

beforeAll(async () => {
  await new PostgresStore({ pool: db.pool(), schema: db.schema }).migrate();
  await db.pool().query(`CREATE TABLE "${db.schema}".shipments (id serial PRIMARY KEY, key text NOT NULL)`);
});
afterAll(async () => {
  const connection = await connect(amqpUrl);
  const channel = await connection.createChannel();
  await channel.deleteQueue(queue);
  await connection.close();
  await db.drop();
});

test('killed between commit and ack: the broker redelivers, the replay is acked, the effect happened once', async () => {
  const connection = await connect(amqpUrl);
  const channel = await connection.createChannel();
  await channel.assertQueue(queue, { durable: false });
  const key = `order-${randomUUID()}`;
  const script = join(__dirname, 'fixtures', 'consumer.ts');
  const env = { AMQP_URL: amqpUrl, QUEUE: queue, DATABASE_URL: connectionString, SCHEMA: db.schema };

  const doomed = await startAppProcess(script, { ...env, HANG_AFTER_COMMIT: '1' });
  channel.sendToQueue(queue, Buffer.from('{"order":1}'), { messageId: key });
  await doomed.waitForLine((line) => line === `executed ${key}`, 45_000);
  await doomed.kill();

  const survivor = await startAppProcess(script, env);
  try {
    // RabbitMQ redelivers the unacked message once the dead consumer's connection is gone.
    await survivor.waitForLine((line) => line === `replayed ${key}`, 45_000);
    const effects = await db
      .pool()
      .query(`SELECT count(*)::int AS n FROM "${db.schema}".shipments WHERE key = $1`, [key]);
    expect(effects.rows[0].n).toBe(1);
    // Acked: nothing left in the queue, nothing unacked once the survivor is gone.
    await survivor.kill();
    let remaining = -1;
    for (let i = 0; i < 50 && remaining !== 0; i++) {
      remaining = (await channel.checkQueue(queue)).messageCount;
      if (remaining !== 0) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(remaining).toBe(0);
  } finally {
    await survivor.kill();
    await connection.close();
  }
});
