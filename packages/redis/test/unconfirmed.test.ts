/**
 * @services redis-server
 */
import { idempotent, type UnconfirmedWriteEvent } from '@oncely/core';
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';
import { RedisReplicationError, RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// waitForReplicas on a private primary with one replica: a write the paused replica (SIGSTOP) cannot confirm stays
// with its execution. The store re-sends it in the background until a WAIT confirms it (RedisReplicationError's
// `confirmation`), and stops when the key is no longer the owner's or the store is closed. The failover itself, where
// the re-send lands on the promoted replica, is failover-unconfirmed.test.ts.
jest.setTimeout(60_000);

const LEASE_MS = 20_000;
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
  primary?.resume();
  await replica?.stop();
  await primary?.stop();
});

const response = (text: string) => ({ status: 201, headers: {}, body: Buffer.from(text) });

/** What `call` threw: a RedisReplicationError, or the test fails. */
async function unconfirmed(call: () => Promise<unknown>): Promise<RedisReplicationError> {
  try {
    await call();
  } catch (error) {
    if (error instanceof RedisReplicationError) return error;
    throw error;
  }
  throw new Error('expected a RedisReplicationError');
}

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('on %s', (name, kind) => {
  const tag = `unconfirmed-${name.replace(' ', '-')}`;
  let connected: ConnectedClient;
  let store: RedisStore;

  beforeAll(async () => {
    connected = await kind.standalone(primary.url, 1000);
    store = new RedisStore({
      client: connected.client,
      prefix: `${tag}:`,
      waitForReplicas: { replicas: 1, timeout: 200 },
    });
  });
  afterAll(async () => {
    await store.close();
    await connected.close();
  });

  // The reservation itself must be confirmed within the 200 ms WAIT; on a loaded machine (a CI run beside crash
  // tests) the replica can miss it, and that refusal released the key, nothing ran: ask again.
  const acquire = async (key: string) => {
    for (let attempt = 1; ; attempt++) {
      try {
        const acquired = await store.acquire(key, { fingerprint: 'f', lockTimeoutMs: LEASE_MS });
        if (acquired.status === 'acquired') return acquired.token;
        // After a refused attempt, its release may still be on its way.
        if (attempt === 1 || acquired.status !== 'in_progress' || attempt === 10)
          throw new Error(`expected acquired, got ${acquired.status}`);
      } catch (error) {
        if (!(error instanceof RedisReplicationError && error.operation === 'acquire') || attempt === 10)
          throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  };

  test('an unconfirmed completion is re-sent until the replica confirms it; the replica then has it', async () => {
    const token = await acquire('c');
    replica.pause();
    let error: RedisReplicationError;
    try {
      error = await unconfirmed(() => store.complete('c', token, response('done'), 60_000));
      // Still unconfirmed while the replica is paused: the re-sending goes on.
      const early = await Promise.race([
        error.confirmation,
        new Promise((r) => setTimeout(r, 700, 'pending')),
      ]);
      expect(early).toBe('pending');
    } finally {
      replica.resume();
    }
    expect(error).toMatchObject({ operation: 'complete', confirmed: 0, wanted: 1, recordWritten: true });
    expect(await error.confirmation).toBe('confirmed');
    expect(await replica.cli('getrange', `${tag}:c`, '0', '0')).toBe('c');
    // The record was not changed by being written again: the replay is the response.
    const replay = await store.acquire('c', { fingerprint: 'f', lockTimeoutMs: LEASE_MS });
    expect(replay.status === 'completed' && Buffer.from(replay.response.body).toString()).toBe('done');
  });

  test('an unconfirmed release is re-sent until the replica confirms it; the replica no longer holds the key', async () => {
    const token = await acquire('r');
    await waitUntil(
      async () => (await replica.cli('exists', `${tag}:r`)) === '1',
      'the lease on the replica',
    );
    replica.pause();
    let error: RedisReplicationError;
    try {
      error = await unconfirmed(() => store.release('r', token));
    } finally {
      replica.resume();
    }
    expect(error).toMatchObject({ operation: 'release', recordWritten: true });
    expect(await error.confirmation).toBe('confirmed');
    expect(await replica.cli('exists', `${tag}:r`)).toBe('0');
  });

  test('a completion whose call got no reply (the primary hung past the command timeout) is re-sent and confirmed', async () => {
    const token = await acquire('t');
    primary.pause();
    let error: RedisReplicationError;
    try {
      error = await unconfirmed(() => store.complete('t', token, response('late'), 60_000));
    } finally {
      primary.resume();
    }
    expect(error).toMatchObject({ operation: 'complete', recordWritten: false });
    expect(error.cause).toBeInstanceOf(Error);
    expect(await error.confirmation).toBe('confirmed');
    await waitUntil(async () => (await replica.cli('getrange', `${tag}:t`, '0', '0')) === 'c', 'the record');
  });

  test('consumers: idempotent() over the store reports the unconfirmed completion and its confirmation', async () => {
    const events: UnconfirmedWriteEvent[] = [];
    const handle = idempotent(
      async (message: { id: string }) => {
        replica.pause(); // the reservation is confirmed, the completion will not be
        return { handled: message.id };
      },
      { store, key: (message) => message.id, hooks: { onUnconfirmedWrite: (e) => void events.push(e) } },
    );
    try {
      expect(await handle({ id: 'message-1' })).toEqual({ handled: 'message-1' });
    } finally {
      replica.resume();
    }
    await waitUntil(() => events.length === 2, 'the confirmation to end');
    expect(events).toEqual([
      { adapter: 'consumer', key: 'message-1', operation: 'complete', outcome: 'unconfirmed' },
      { adapter: 'consumer', key: 'message-1', operation: 'complete', outcome: 'confirmed' },
    ]);
    expect(await replica.cli('getrange', `${tag}:message-1`, '0', '0')).toBe('c');
  });

  test("the re-sending ends as lost when the key is another owner's, and as gave_up once the store is closed", async () => {
    const lostToken = await acquire('lost');
    const closedToken = await acquire('closed');
    replica.pause();
    let lost: RedisReplicationError;
    let closed: RedisReplicationError;
    try {
      lost = await unconfirmed(() => store.complete('lost', lostToken, response('x'), 60_000));
      closed = await unconfirmed(() => store.complete('closed', closedToken, response('y'), 60_000));
      // Another request's lease where the completion was: what a promoted replica holds after a failover that lost
      // both the completion and the reservation's lease.
      await primary.cli('set', `${tag}:lost`, `p${'0'.repeat(36)}f`, 'px', String(LEASE_MS));
      expect(await lost.confirmation).toBe('lost');
      await store.close();
      expect(await closed.confirmation).toBe('gave_up');
    } finally {
      replica.resume();
    }
    // The other owner's lease was left as it was.
    expect(await primary.cli('get', `${tag}:lost`)).toBe(`p${'0'.repeat(36)}f`);
  });
});
