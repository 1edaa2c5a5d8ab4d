/**
 * @services redis
 */
// A Lambda function bundled as it is deployed (esbuild, one file) and imported by a fresh `node`, with its
// DynamoDB and Redis clients pointed at a proxy that records every connection: importing @oncely/lambda, building
// the stores and the handlers open none; the first event is what connects.
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { connect, createServer, type Socket, type Server as TcpServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBStore } from '@oncely/dynamodb';
import { freePort } from '@oncely/testing';
import { build } from 'esbuild';
import Redis from 'ioredis';

// The SDK warns once per process that its future releases need Node 22: noise here and in the function's process.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = 'true';

// dynalite 4 ships no types: the one call used here.
const dynalite = require('dynalite') as (options: Record<string, number>) => Server;

const REDIS_URL = new URL(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const CREDENTIALS = { accessKeyId: 'oncely-local', secretAccessKey: 'oncely-local' };
const PACKAGE_DIR = join(__dirname, '..');
const run = randomBytes(4).toString('hex');
const tableName = `oncely-cold-${run}`;

/** A TCP proxy to `target` that records when each connection was opened. */
interface Recorder {
  port: number;
  connections: number;
  close(): Promise<void>;
}

async function recorder(target: { host: string; port: number }): Promise<Recorder> {
  const sockets = new Set<Socket>();
  const state = { connections: 0 };
  const server: TcpServer = createServer((client) => {
    state.connections++;
    const upstream = connect(target);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
      s.on('close', () => sockets.delete(s));
    }
    client.pipe(upstream).pipe(client);
  });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    port,
    get connections() {
      return state.connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

// The function as a user writes it: stores and handlers built at module scope, where Lambda's init phase runs
// them once per execution environment. `lazyConnect` leaves ioredis idle until the first command (without it,
// `new Redis()` itself connects: the client's choice, not oncely's; the control test below shows the proxy sees it).
const FUNCTION = `
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBStore } from '@oncely/dynamodb';
import { withIdempotency, idempotentBatch } from '@oncely/lambda';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';

const env = process.env;
const dynamo = new DynamoDBStore({
  client: new DynamoDBClient({ endpoint: env.DYNAMO_ENDPOINT, region: 'us-east-1', credentials: ${JSON.stringify(CREDENTIALS)}, maxAttempts: 1 }),
  tableName: env.TABLE,
  prefix: env.PREFIX,
});
export const redis = new Redis({ host: '127.0.0.1', port: Number(env.REDIS_PORT), lazyConnect: __LAZY__, maxRetriesPerRequest: 1 });
const redisStore = new RedisStore({ client: redis, prefix: env.PREFIX });
const charge = async (event) => ({ statusCode: 201, headers: { 'content-type': 'application/json' }, body: event.body });
export const http = withIdempotency(charge, { store: dynamo });
export const httpRedis = withIdempotency(charge, { store: redisStore });
export const batch = idempotentBatch(async () => {}, { store: redisStore });
`;

/** Bundles FUNCTION (with `lazyConnect` as given) from the sources, the SDK included; returns the file. */
async function bundle(dir: string, lazy: boolean): Promise<string> {
  const entry = join(dir, `fn-${lazy}.mjs`);
  writeFileSync(entry, FUNCTION.replace('__LAZY__', String(lazy)));
  const outfile = join(dir, `bundle-${lazy}.mjs`);
  await build({
    entryPoints: [entry],
    outfile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: ['@oncely/source'],
    nodePaths: [join(PACKAGE_DIR, 'node_modules')],
    // This package itself, from its sources (its own node_modules does not hold it).
    alias: { '@oncely/lambda': join(PACKAGE_DIR, 'src', 'index.ts') },
    banner: {
      js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);",
    },
    logLevel: 'silent',
  });
  return outfile;
}

/** A fresh `node` that imports the bundle, says "imported", then invokes a handler per line of stdin. */
function startFunction(file: string, env: Record<string, string>) {
  const driver = `
    import { createInterface } from 'node:readline';
    const fn = await import(${JSON.stringify(`file://${file}`)});
    console.log(JSON.stringify({ imported: true }));
    const context = { awsRequestId: 'r', functionName: 'f', getRemainingTimeInMillis: () => 30000 };
    for await (const line of createInterface({ input: process.stdin })) {
      const { handler, event } = JSON.parse(line);
      try {
        console.log(JSON.stringify({ result: await fn[handler](event, context) }));
      } catch (error) {
        console.log(JSON.stringify({ error: String(error && error.stack || error) }));
      }
    }
    fn.redis.disconnect();`;
  const child: ChildProcess = spawn(process.execPath, ['--input-type=module', '-e', driver], {
    env: { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true', ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (chunk) => {
    stderr += String(chunk);
  });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    const { value, done } = await lines.next();
    if (done) throw new Error(`the function's process ended: ${stderr}`);
    return JSON.parse(value as string) as Record<string, unknown>;
  };
  return {
    next,
    invoke: async (handler: string, event: unknown) => {
      child.stdin?.write(`${JSON.stringify({ handler, event })}\n`);
      const answer = await next();
      if ('error' in answer) throw new Error(String(answer.error));
      return answer.result as Record<string, unknown>;
    },
    stop: () => {
      child.stdin?.end();
      child.kill('SIGKILL');
    },
  };
}

const httpEvent = (key: string) => ({
  version: '2.0',
  routeKey: 'POST /charges',
  rawPath: '/charges',
  rawQueryString: '',
  headers: { 'content-type': 'application/json', 'idempotency-key': key },
  requestContext: {
    accountId: '123456789012',
    apiId: 'api',
    domainName: 'example.com',
    domainPrefix: 'example',
    http: {
      method: 'POST',
      path: '/charges',
      protocol: 'HTTP/1.1',
      sourceIp: '192.0.2.1',
      userAgent: 'test',
    },
    requestId: 'req',
    routeKey: 'POST /charges',
    stage: '$default',
    time: '26/Nov/2026:00:00:00 +0000',
    timeEpoch: 0,
  },
  body: '{"amount":1000}',
  isBase64Encoded: false,
});

const sqsEvent = (id: string) => ({
  Records: [
    {
      messageId: id,
      receiptHandle: 'rh',
      body: '{}',
      attributes: {
        ApproximateReceiveCount: '1',
        SentTimestamp: '0',
        SenderId: 's',
        ApproximateFirstReceiveTimestamp: '0',
      },
      messageAttributes: {},
      md5OfBody: '',
      eventSource: 'aws:sqs',
      eventSourceARN: 'arn:aws:sqs:us-east-1:123456789012:q',
      awsRegion: 'us-east-1',
    },
  ],
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let dir: string;
let server: Server;
let dynamoProxy: Recorder;
let redisProxy: Recorder;
let lazyBundle: string;
let eagerBundle: string;
let env: Record<string, string>;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'oncely-cold-'));
  server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  const dynamoPort = await freePort();
  await new Promise<void>((resolve) => server.listen(dynamoPort, '127.0.0.1', () => resolve()));
  const admin = new DynamoDBClient({
    endpoint: `http://127.0.0.1:${dynamoPort}`,
    region: 'us-east-1',
    credentials: CREDENTIALS,
  });
  await new DynamoDBStore({ client: admin, tableName }).createTable();
  admin.destroy();
  dynamoProxy = await recorder({ host: '127.0.0.1', port: dynamoPort });
  redisProxy = await recorder({ host: REDIS_URL.hostname, port: Number(REDIS_URL.port || 6379) });
  [lazyBundle, eagerBundle] = await Promise.all([bundle(dir, true), bundle(dir, false)]);
  env = {
    DYNAMO_ENDPOINT: `http://127.0.0.1:${dynamoProxy.port}`,
    TABLE: tableName,
    PREFIX: `oncely-cold-${run}:`,
    REDIS_PORT: String(redisProxy.port),
  };
}, 120_000);

afterAll(async () => {
  // Only this file's Redis keys (the batch's record).
  const redis = new Redis(REDIS_URL.href);
  const keys: string[] = [];
  for await (const batch of redis.scanStream({ match: `oncely-cold-${run}:*`, count: 1000 })) {
    keys.push(...(batch as string[]));
  }
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
  await dynamoProxy?.close();
  await redisProxy?.close();
  await new Promise((resolve) => server?.close(resolve));
  rmSync(dir, { recursive: true, force: true });
});

test('importing the function opens no connection; its first event does', async () => {
  const before = { dynamo: dynamoProxy.connections, redis: redisProxy.connections };
  const fn = startFunction(lazyBundle, env);
  try {
    expect(await fn.next()).toEqual({ imported: true });
    // Timers and promises started at import would have run by now.
    await sleep(500);
    expect(dynamoProxy.connections - before.dynamo).toBe(0);
    expect(redisProxy.connections - before.redis).toBe(0);

    const key = `k-${run}`;
    const first = await fn.invoke('http', httpEvent(key));
    expect(first.statusCode).toBe(201);
    expect(dynamoProxy.connections - before.dynamo).toBeGreaterThan(0);
    expect(redisProxy.connections - before.redis).toBe(0);
    const replay = await fn.invoke('http', httpEvent(key));
    expect(replay.statusCode).toBe(201);
    const headers = Object.fromEntries(
      Object.entries((replay.headers ?? {}) as Record<string, string>).map(([k, v]) => [k.toLowerCase(), v]),
    );
    expect(headers['idempotent-replayed']).toBe('true');

    const batch = await fn.invoke('batch', sqsEvent(`m-${run}`));
    expect(batch).toEqual({ batchItemFailures: [] });
    expect(redisProxy.connections - before.redis).toBeGreaterThan(0);
  } finally {
    fn.stop();
  }
});

test('control: the proxy sees a client that connects at import (ioredis without lazyConnect)', async () => {
  const before = redisProxy.connections;
  const fn = startFunction(eagerBundle, env);
  try {
    expect(await fn.next()).toEqual({ imported: true });
    const deadline = Date.now() + 10_000;
    while (redisProxy.connections === before && Date.now() < deadline) await sleep(50);
    expect(redisProxy.connections - before).toBeGreaterThan(0);
  } finally {
    fn.stop();
  }
});
