/**
 * @services postgres redis
 */
import { Agent, request } from 'node:http';
import { join } from 'node:path';
import {
  type AppProcess,
  type CrashAnswer,
  checkCrashRun,
  killRepeatedly,
  sleep,
  startAppProcess,
  startChargeProvider,
  waitUntil,
} from '@oncely/testing';
import Redis from 'ioredis';
import { PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

// step() on real servers: an Express app whose handler runs three steps per key (an order row, a charge at a
// provider that honours Idempotency-Key, an outbox row) is SIGKILLed at random points while requests are in flight
// and restarted, again and again; a client retries each of 200 keys until it gets its answer. The provider runs in
// this process; the app's rows and its onStep events go to a schema of this run's own; RedisStore's keys live
// under a prefix of this run's own, deleted afterwards.
jest.setTimeout(180_000);

const KEYS = 200;
const CLIENTS = 20;
const KILLS = 5;
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const script = join(__dirname, 'fixtures', 'steps-app.ts');
const agent = new Agent({ keepAlive: true, maxSockets: 64 });

/** One POST /orders; resolves with the status and the parsed body, rejects on a connection error. */
function post(url: string, key: string): Promise<{ status: number; body: unknown; replayed: boolean }> {
  const body = '{"amount":100}';
  return new Promise((resolve, reject) => {
    const req = request(
      `${url}/orders`,
      {
        method: 'POST',
        agent,
        timeout: 15_000,
        headers: {
          'content-type': 'application/json',
          'content-length': body.length,
          'idempotency-key': key,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('error', reject);
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          try {
            resolve({
              status: res.statusCode ?? 0,
              body: text === '' ? undefined : (JSON.parse(text) as unknown),
              replayed: res.headers['idempotent-replayed'] === 'true',
            });
          } catch (error) {
            reject(error);
          }
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

const processes: AppProcess[] = [];
const schemas: ReturnType<typeof testSchema>[] = [];
let redis: Redis;

beforeAll(() => {
  redis = new Redis(redisUrl);
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  await Promise.all(schemas.map((s) => s.drop()));
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', 'oncely-steps-crash-*', 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  await redis.quit();
  agent.destroy();
});

test.each(['redis', 'postgres'])(
  '%s: 200 keys, three steps each, the app SIGKILLed repeatedly: each charge once, no recorded step run again',
  async (storeKind) => {
    const db = testSchema();
    schemas.push(db);
    const pool = db.pool();
    if (storeKind === 'postgres') await new PostgresStore({ pool, schema: db.schema }).migrate();
    else await pool.query(`CREATE SCHEMA "${db.schema}"`);
    for (const table of ['orders', 'outbox']) {
      await pool.query(
        `CREATE TABLE "${db.schema}".${table} (seq bigserial PRIMARY KEY, key text NOT NULL, id text NOT NULL, pid int NOT NULL)`,
      );
    }
    await pool.query(
      `CREATE TABLE "${db.schema}".journal (seq bigserial PRIMARY KEY, key text NOT NULL, step text NOT NULL, what text NOT NULL, value text NOT NULL, pid int NOT NULL)`,
    );
    const provider = await startChargeProvider(30);
    const env = {
      STORE: storeKind,
      DATABASE_URL: connectionString,
      SCHEMA: db.schema,
      REDIS_URL: redisUrl,
      REDIS_PREFIX: `oncely-steps-crash-${db.schema}:`,
      PROVIDER_URL: provider.url,
      STEP_DELAY_MS: '40',
      LOCK_TIMEOUT_MS: '1500',
    };
    // Every loop ends by this time, the test passed or not: none outlives it (jest's timeout does not stop them).
    const deadline = Date.now() + 130_000;
    const stopped = () => Date.now() > deadline;
    try {
      let url = 'http://127.0.0.1:1'; // until the first app listens: connection errors, retried
      const start = async () => {
        const p = await startAppProcess(script, env);
        processes.push(p);
        url = p.url;
        return p;
      };

      // The client: CLIENTS loops, each taking the next key and retrying it until its answer (a 2xx) arrives.
      const keys = Array.from({ length: KEYS }, (_, i) => `order-${i}`);
      const answers = new Map<string, CrashAnswer>();
      const seen = new Map<string, number>();
      const unexpected: string[] = [];
      let next = 0;
      const client = async () => {
        for (let key = keys[next++]; key !== undefined && !stopped(); key = keys[next++]) {
          while (!stopped()) {
            let outcome: string;
            try {
              const { status, body } = await post(url, key);
              outcome = String(status);
              if (status === 201) {
                answers.set(key, body as CrashAnswer);
                break;
              }
              if (status !== 409 && status < 500) {
                unexpected.push(`${key}: ${status} ${JSON.stringify(body)}`);
                break;
              }
            } catch {
              outcome = 'connection error';
            }
            seen.set(outcome, (seen.get(outcome) ?? 0) + 1);
            await sleep(outcome === '409' ? 100 : 50);
          }
        }
      };
      const started = Date.now();
      const clients = Promise.all(Array.from({ length: CLIENTS }, client));
      const { survivor, killed } = await killRepeatedly({
        start,
        kills: KILLS,
        upMs: [0, 600],
        progress: () => answers.size,
        done: () => stopped() || answers.size + unexpected.length === KEYS,
      });
      await waitUntil(
        () => answers.size + unexpected.length === KEYS,
        'every key answered',
        Math.max(1, deadline - Date.now()),
      );
      await clients;
      const elapsed = Date.now() - started;
      expect(unexpected).toEqual([]);

      // Every key replays its answer from the survivor.
      const replays = await Promise.all(keys.map((key) => post(survivor.url, key)));
      expect(replays.filter((r) => r.status !== 201 || !r.replayed)).toEqual([]);
      expect(replays.map((r) => r.body)).toEqual(keys.map((key) => answers.get(key)));

      const rows = async (table: string) =>
        (await pool.query(`SELECT * FROM "${db.schema}".${table} ORDER BY seq`)).rows;
      const check = checkCrashRun({
        answers,
        orders: await rows('orders'),
        outbox: await rows('outbox'),
        journal: await rows('journal'),
        provider,
        killed,
      });
      expect({ problems: check.problems, first: check.first }).toEqual({ problems: 0, first: [] });
      // The crashes did hit executions in the middle: later attempts resumed from recorded steps.
      expect(killed.size).toBeGreaterThanOrEqual(3);
      expect(check.replays).toBeGreaterThan(0);
      console.log(
        `steps crash (${storeKind}): ${KEYS} keys in ${elapsed}ms; ${check.summary}; failed attempts ${JSON.stringify(Object.fromEntries(seen))}`,
      );
    } finally {
      await provider.close();
    }
  },
);
