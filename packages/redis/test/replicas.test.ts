/**
 * @services redis-server
 */
import type { AddressInfo } from 'node:net';
import { idempotency } from '@oncely/express';
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';
import express from 'express';
import Redis from 'ioredis';
import request from 'supertest';
import { type NodeRedisClient, RedisReplicationError, RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { commandsDuring } from './monitor';

// waitForReplicas on a private primary with one replica of its own. A paused replica (SIGSTOP) confirms nothing,
// which is how a reservation or completion that fewer replicas confirmed is produced.
jest.setTimeout(60_000);

// Long enough for a replica on a loaded machine to confirm; the cases with a paused replica wait it out.
const WAIT_TIMEOUT = 1000;
let primary: PrivateRedis;
let replica: PrivateRedis;

beforeAll(async () => {
  primary = await startRedis();
  replica = await startRedis(['--replicaof', '127.0.0.1', String(primary.port)]);
  await waitUntil(
    async () => (await replica.cli('info', 'replication')).includes('master_link_status:up'),
    'the replica to sync',
  );
});
afterAll(async () => {
  await replica?.stop();
  await primary?.stop();
});

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (name, kind) => {
  const tag = name.replace(' ', '-');
  let connected: ConnectedClient;
  let url: string;
  let server: import('node:http').Server;
  const runs = new Map<string, number>();
  const storeErrors: { operation: string; error: unknown }[] = [];

  beforeAll(async () => {
    connected = await kind.standalone(primary.url, 2_000);
    const store = new RedisStore({
      client: connected.client,
      prefix: `${tag}:`,
      waitForReplicas: { replicas: 1, timeout: WAIT_TIMEOUT },
    });
    const app = express();
    app.use(express.json());
    app.use(
      idempotency({
        store,
        hooks: { onStoreError: (event) => void storeErrors.push(event) },
      }),
    );
    app.post('/charges', (req, res) => {
      const key = req.idempotencyKey ?? '';
      runs.set(key, (runs.get(key) ?? 0) + 1);
      // The handler can pause the replica, so that the completion (but not the reservation) goes unconfirmed.
      if (req.body.pauseReplica === true) replica.pause();
      res.status(201).json({ key });
    });
    server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    replica.resume();
    await connected.close();
    server.closeAllConnections();
    server.close();
  });

  const post = (key: string, body: object = {}) =>
    request(url).post('/charges').set('Idempotency-Key', key).send(body);

  test('replica up: reservations and completions are confirmed, the replica has the record', async () => {
    const res = await post(`${tag}-ok`);
    expect(res.status).toBe(201);
    expect((await post(`${tag}-ok`)).headers['idempotent-replayed']).toBe('true');
    expect(runs.get(`${tag}-ok`)).toBe(1);
    await waitUntil(
      async () => (await replica.cli('getrange', `${tag}:${tag}-ok`, '0', '0')) === 'c',
      'the completed record on the replica',
    );
    expect(storeErrors).toEqual([]);
  });

  test('replica not confirming: a reservation fails closed (503), nothing runs, the key is free afterwards', async () => {
    replica.pause();
    let res: request.Response;
    try {
      res = await post(`${tag}-unconfirmed`);
    } finally {
      replica.resume();
    }
    expect(res.status).toBe(503);
    expect(res.headers['content-type']).toMatch(/problem\+json/);
    expect(runs.get(`${tag}-unconfirmed`)).toBeUndefined();
    // The reservation was written on the primary and released behind the failed confirmation.
    await waitUntil(
      async () => (await primary.cli('exists', `${tag}:${tag}-unconfirmed`)) === '0',
      'the unconfirmed reservation to be released',
    );
    await waitUntil(
      async () => (await post(`${tag}-unconfirmed`)).status === 201,
      'the key to run once the replica confirms again',
    );
    expect(runs.get(`${tag}-unconfirmed`)).toBe(1);
  });

  test('a completion not confirmed: the response is still sent, the store error reported; replays work', async () => {
    storeErrors.length = 0;
    let res: request.Response;
    try {
      res = await post(`${tag}-late`, { pauseReplica: true });
    } finally {
      replica.resume();
    }
    expect(res.status).toBe(201);
    expect(res.body).toEqual({ key: `${tag}-late` });
    expect(storeErrors).toHaveLength(1);
    expect(storeErrors[0]?.operation).toBe('complete');
    expect(storeErrors[0]?.error).toBeInstanceOf(RedisReplicationError);
    expect(storeErrors[0]?.error).toMatchObject({
      operation: 'complete',
      confirmed: 0,
      wanted: 1,
      recordWritten: true,
    });
    // The record is on the primary (and reaches the replica once it runs again): the retry is a replay.
    const replay = await post(`${tag}-late`, { pauseReplica: true });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs.get(`${tag}-late`)).toBe(1);
  });
});

test('each confirmation goes out with its script call: one WAIT right after each EVALSHA that wrote (acquire stays a script with waitForReplicas)', async () => {
  const client = new Redis(primary.url);
  const store = new RedisStore({ client, prefix: 'order:', waitForReplicas: { replicas: 1, timeout: 500 } });
  await store.acquire('warm', { fingerprint: 'f', lockTimeoutMs: 5000 }); // scripts loaded
  const commands = await commandsDuring(
    primary.url,
    async () => {
      const acquired = await store.acquire('k', { fingerprint: 'f', lockTimeoutMs: 5000 });
      if (acquired.status !== 'acquired') throw new Error('expected acquired');
      await store.complete('k', acquired.token, { status: 200, headers: {}, body: Buffer.from('x') }, 60_000);
    },
    client,
  );
  expect(commands).toEqual(['evalsha', 'wait', 'evalsha', 'wait']);
  await store.close();
  client.disconnect();
});

test('with waitForReplicas a conflict is one EVALSHA, sent before the WAIT: no SET ahead of a script that a WAIT would hold up', async () => {
  const client = new Redis(primary.url);
  const store = new RedisStore({
    client,
    prefix: 'conflict:',
    waitForReplicas: { replicas: 1, timeout: 500 },
  });
  await store.acquire('warm', { fingerprint: 'f', lockTimeoutMs: 5000 }); // scripts loaded
  expect((await store.acquire('held', { fingerprint: 'f', lockTimeoutMs: 5000 })).status).toBe('acquired');
  let second: Awaited<ReturnType<RedisStore['acquire']>> | undefined;
  const commands = await commandsDuring(
    primary.url,
    async () => {
      second = await store.acquire('held', { fingerprint: 'f', lockTimeoutMs: 5000 });
    },
    client,
  );
  expect(second?.status).toBe('in_progress');
  // With a SET first (3b5f598), the script followed the turn's WAIT and waited out its timeout behind it.
  expect(commands).toEqual(['evalsha', 'wait']);
  await store.close();
  client.disconnect();
});

test('one WAIT confirms every reservation of an event-loop turn (group confirmation)', async () => {
  const client = new Redis(primary.url);
  const store = new RedisStore({ client, prefix: 'group:', waitForReplicas: { replicas: 1, timeout: 500 } });
  await store.acquire('warm', { fingerprint: 'f', lockTimeoutMs: 5000 }); // scripts loaded
  const commands = await commandsDuring(
    primary.url,
    async () => {
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          store.acquire(`g${i}`, { fingerprint: 'f', lockTimeoutMs: 5000 }),
        ),
      );
      expect(results.every((r) => r.status === 'acquired')).toBe(true);
    },
    client,
  );
  expect(commands).toEqual([...Array(20).fill('evalsha'), 'wait']);
  await store.close();
  client.disconnect();
});

test('a node-redis Sentinel client is refused with the fix (its commands take other arguments)', () => {
  const sentinelLike = {
    sendCommand: async () => null,
    duplicate: () => null,
    withTypeMapping: () => null,
    isOpen: true,
    getMasterNode: () => undefined,
  };
  expect(() => new RedisStore({ client: sentinelLike as unknown as NodeRedisClient })).toThrow(
    /node-redis Sentinel.*new Redis\(\{ sentinels, name \}\)/,
  );
});

test('waitForReplicas is checked at construction, and refused with a Cluster client', () => {
  const client = new Redis(primary.url, { lazyConnect: true });
  const bad = [
    [null, /must be an object/],
    [{ replicas: 0, timeout: '1s' }, /replicas.*at least 1/],
    [{ replicas: 1.5, timeout: '1s' }, /replicas.*whole number/],
    [{ replicas: 1, timeout: 0 }, /timeout.*at least 1ms/],
    [{ replicas: 1, timeout: 'soon' }, /timeout.*duration/],
  ] as const;
  for (const [waitForReplicas, message] of bad) {
    expect(
      () =>
        new RedisStore({
          client,
          waitForReplicas: waitForReplicas as never,
        }),
    ).toThrow(message);
  }
  const cluster = new Redis.Cluster([{ host: '127.0.0.1', port: primary.port }], { lazyConnect: true });
  expect(
    () => new RedisStore({ client: cluster, waitForReplicas: { replicas: 1, timeout: '100ms' } }),
  ).toThrow(/standalone or Sentinel client/);
  client.disconnect();
  cluster.disconnect();
});
