/**
 * @services redis-server
 */
import { randomUUID } from 'node:crypto';
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';
import { RedisReplicationError, RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { commandsDuring } from './monitor';

// recordStep with waitForReplicas, on a private primary with one replica of its own: a step is confirmed by a WAIT
// as a completion is; a paused replica (SIGSTOP) confirms nothing.
jest.setTimeout(60_000);

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
  replica?.resume();
  await replica?.stop();
  await primary?.stop();
});

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (name, kind) => {
  const prefix = `${name.replace(' ', '-')}:`;
  let connected: ConnectedClient;
  let store: RedisStore;

  beforeAll(async () => {
    connected = await kind.standalone(primary.url, 2_000);
    store = new RedisStore({
      client: connected.client,
      prefix,
      waitForReplicas: { replicas: 1, timeout: 200 },
    });
  });
  afterAll(async () => {
    replica.resume();
    await store.close();
    await connected.close();
  });

  const take = async (key: string) => {
    const result = await store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    if (result.status !== 'acquired') throw new Error(result.status);
    return result.token;
  };

  test('a step is confirmed by a WAIT right behind its script call; the replica has it', async () => {
    const key = `ok-${randomUUID()}`;
    const token = await take(key);
    await store.recordStep(key, token, 'warm-up', '0', 60_000); // loads the script
    const commands = await commandsDuring(primary.url, async () => {
      expect(await store.recordStep(key, token, 'charge', '"ch_1"', 60_000)).toBe(true);
    });
    // Each send is its script call with a WAIT right behind it. Under load a 200 ms WAIT can time out before the
    // replica acknowledges, and the store sends the step again: that is one more such pair, never a lone call.
    expect(commands.length).toBeGreaterThanOrEqual(2);
    expect(commands).toEqual(commands.map((_, i) => (i % 2 === 0 ? 'evalsha' : 'wait')));
    expect(commands.length % 2).toBe(0);
    const onReplica = await replica.cli('get', `${prefix}${key}`);
    expect(onReplica.startsWith('s')).toBe(true);
    expect(onReplica).toContain('charge6:"ch_1"');
  });

  test('a step the replica does not confirm rejects, naming the step; it is on the primary, and a retry replays it', async () => {
    const key = `late-${randomUUID()}`;
    const token = await take(key);
    replica.pause();
    let error: unknown;
    try {
      error = await store.recordStep(key, token, 'charge', '"ch_2"', 60_000).then(
        () => undefined,
        (e: unknown) => e,
      );
    } finally {
      replica.resume();
    }
    expect(error).toBeInstanceOf(RedisReplicationError);
    expect(error).toMatchObject({ operation: 'recordStep', confirmed: 0, wanted: 1, recordWritten: true });
    expect((error as Error).message).toContain('step "charge"');
    // The handler stops and the key is released (confirmed); the next attempt resumes with the step.
    expect(await store.release(key, token)).toBe(true);
    const resumed = await store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    expect(resumed).toMatchObject({ status: 'acquired', steps: { charge: '"ch_2"' } });
  });

  test('an acquire that resumed a record with steps but timed out on the client is released behind it', async () => {
    // A short command timeout of its own; with waitForReplicas, acquire goes straight to the script.
    const short = await kind.standalone(primary.url, 300);
    const timing = new RedisStore({
      client: short.client,
      prefix,
      waitForReplicas: { replicas: 1, timeout: 100 },
    });
    try {
      const key = `undo-${randomUUID()}`;
      const token = await take(key);
      expect(await store.recordStep(key, token, 'charge', '"ch_3"', 60_000)).toBe(true);
      expect(await store.release(key, token)).toBe(true);
      await timing.get(key); // connected and the scripts' connection warm
      primary.pause();
      let failed: unknown;
      try {
        // Another fingerprint than the record keeps: the release behind it cannot know the kept one.
        failed = await timing.acquire(key, { fingerprint: 'fp-other', lockTimeoutMs: 30_000 }).then(
          () => undefined,
          (e: unknown) => e,
        );
      } finally {
        primary.resume();
      }
      expect(failed).toBeInstanceOf(Error);
      // Redis runs the acquire once resumed (a 30 s lease); the release behind it frees the key well before.
      // node-redis retries that release at growing intervals: allow for them, under the lease.
      await waitUntil(async () => (await store.get(key))?.state === 'released', 'the undone resume', 25_000);
      const resumed = await store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: 30_000 });
      expect(resumed).toMatchObject({ status: 'acquired', steps: { charge: '"ch_3"' } });
    } finally {
      primary.resume();
      await timing.close();
      await short.close();
      // The pause may have cut the replica's link: the next tests need its confirmations.
      await waitUntil(
        async () => (await replica.cli('info', 'replication')).includes('master_link_status:up'),
        'the replica to sync again',
      );
    }
  });

  test('a fenced step resolves false without waiting for a confirmation', async () => {
    const key = `fenced-${randomUUID()}`;
    await take(key);
    replica.pause();
    try {
      expect(await store.recordStep(key, `${randomUUID()}fp`, 'charge', '1', 60_000)).toBe(false);
    } finally {
      replica.resume();
    }
  });
});
