/**
 * @services redis-server
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// A reply lost with its connection, after Redis ran the command: ioredis reconnects and sends the command again
// (`autoResendUnfulfilledCommands`, on by default, and still with the recommended `maxRetriesPerRequest: 1` when
// the first reconnection succeeds), so the second run's reply is the one the store gets. A proxy between the
// client and a private redis-server drops the reply to the command under test and closes both sides, as a
// connection reset would.
jest.setTimeout(30_000);

// Longer than any wait below, so that a lease seen free was released, not lapsed.
const LOCK_TIMEOUT = 60_000;
// node-redis pings every half of it: long, so that the reply the proxy drops is the command's, not a PING's.
const COMMAND_TIMEOUT = 20_000;

/**
 * A TCP proxy to `port`; `dropNextReply()` makes it swallow the next bytes Redis sends and cut the connection;
 * `holdNewConnections()` holds what connections made from then on send, until the function it returns is called.
 */
async function startProxy(port: number): Promise<{
  url: string;
  dropNextReply(): Promise<void>;
  holdNewConnections(): () => void;
  close(): Promise<void>;
}> {
  const sockets = new Set<Socket>();
  let armed: (() => void) | undefined;
  let hold: Promise<void> | undefined;
  const server: Server = createServer((downstream) => {
    const upstream = connect(port, '127.0.0.1');
    const held = hold;
    for (const socket of [downstream, upstream]) {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => {
        sockets.delete(socket);
        downstream.destroy();
        upstream.destroy();
      });
    }
    // Held chunks go on in the order they came (one promise, its reactions run in order).
    downstream.on('data', (chunk) =>
      held === undefined ? upstream.write(chunk) : void held.then(() => upstream.write(chunk)),
    );
    upstream.on('data', (chunk) => {
      const dropped = armed;
      if (dropped === undefined) return void downstream.write(chunk);
      armed = undefined;
      downstream.destroy();
      upstream.destroy();
      dropped();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address() as { port: number };
  return {
    url: `redis://127.0.0.1:${address.port}`,
    dropNextReply: () =>
      new Promise<void>((resolve) => {
        armed = resolve;
      }),
    holdNewConnections: () => {
      let release!: () => void;
      hold = new Promise<void>((resolve) => {
        release = resolve;
      });
      return () => {
        hold = undefined;
        release();
      };
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (_name, kind) => {
  let redis: PrivateRedis;
  let proxy: Awaited<ReturnType<typeof startProxy>>;
  let connected: ConnectedClient;
  let store: RedisStore;
  let n = 0;
  const nextKey = () => `resend-${++n}`;

  beforeAll(async () => {
    redis = await startRedis();
    proxy = await startProxy(redis.port);
    connected = await kind.standalone(proxy.url, COMMAND_TIMEOUT);
    store = new RedisStore({ client: connected.client, prefix: 'o:' });
  });
  afterAll(async () => {
    await store?.close();
    await connected?.close();
    await proxy?.close();
    await redis?.stop();
  });

  /** An acquire whose reply the proxy drops: its result, or the error it failed with. */
  async function acquireWithReplyDropped(key: string) {
    const dropped = proxy.dropNextReply();
    const acquiring = store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT }).then(
      (result) => ({ result }),
      (error: unknown) => ({ error }),
    );
    await dropped;
    return acquiring;
  }
  /** Another acquire of the key (another token): what the key holds now. */
  const probe = (key: string) => store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT });

  test('an acquire whose reply was lost holds the key: resent, it finds its own lease (it was a conflict with itself)', async () => {
    const key = nextKey();
    const outcome = await acquireWithReplyDropped(key);
    if (kind.library === 'ioredis') {
      // ioredis sent the SET again after reconnecting; its reply found the first run's lease.
      expect(outcome).toEqual({ result: { status: 'acquired', token: expect.any(String) } });
      const { token } = (outcome as { result: { token: string } }).result;
      // The lease Redis holds is this call's: 'p' and its token.
      expect(await redis.cli('GET', `o:${key}`)).toBe(`p${token}`);
      // And the caller owns it: its completion is stored and replayed.
      const body = new Uint8Array(Buffer.from('{"ok":true}'));
      expect(await store.complete(key, token, { status: 201, headers: {}, body }, 60_000)).toBe(true);
      expect(await probe(key)).toMatchObject({ status: 'completed', fingerprint: 'fp' });
    } else {
      // node-redis fails the commands in flight when the connection drops: the store throws, and releases the
      // lease it may have written behind it (fenced by its token), so the key is free again without waiting out
      // the lease.
      expect(outcome).toEqual({ error: expect.any(Error) });
      await waitUntil(async () => (await redis.cli('GET', `o:${key}`)) === '', 'the lease released');
      await waitUntil(async () => {
        try {
          return (await probe(key)).status === 'acquired';
        } catch {
          return false; // still reconnecting
        }
      }, 'the key free');
    }
  });

  // Passes on the code before the fix too: it guards against the fix taking anyone's lease for its own.
  test('an acquire that finds another caller\u2019s lease after its reply was lost still conflicts', async () => {
    const key = nextKey();
    const first = await answered(() => probe(key));
    expect(first.status).toBe('acquired');
    const outcome = await acquireWithReplyDropped(key);
    if (kind.library === 'ioredis') {
      expect(outcome).toEqual({
        result: { status: 'in_progress', fingerprint: 'fp', retryAfterMs: expect.any(Number) },
      });
    } else {
      expect(outcome).toEqual({ error: expect.any(Error) });
    }
    // The first caller's lease is untouched either way.
    expect(await redis.cli('GET', `o:${key}`)).toBe(`p${(first as { token: string }).token}`);
  });
});

describe.each(
  CLIENT_KINDS.filter((kind) => kind.library === 'ioredis').map((kind) => [kind.name, kind] as const),
)('RedisStore on %s, a waiter meanwhile', (_name, kind) => {
  let redis: PrivateRedis;
  let proxy: Awaited<ReturnType<typeof startProxy>>;
  let connected: ConnectedClient;
  let direct: ConnectedClient;
  let store: RedisStore;
  let waiter: RedisStore;

  beforeAll(async () => {
    redis = await startRedis();
    proxy = await startProxy(redis.port);
    connected = await kind.standalone(proxy.url, COMMAND_TIMEOUT);
    direct = await kind.standalone(`redis://127.0.0.1:${redis.port}`, COMMAND_TIMEOUT);
    store = new RedisStore({ client: connected.client, prefix: 'o:' });
    // Another process's store, waiting for the key (wait mode), on a connection of its own.
    waiter = new RedisStore({ client: direct.client, prefix: 'o:' });
  });
  afterAll(async () => {
    await waiter?.close();
    await store?.close();
    await direct?.close();
    await connected?.close();
    await proxy?.close();
    await redis?.stop();
  });

  test('resent after a waiter marked its lease (w): acquired, and its completion wakes the waiter', async () => {
    const dropped = proxy.dropNextReply();
    // The reconnection (and so the resend) waits until the waiter has marked the lease.
    const release = proxy.holdNewConnections();
    const acquiring = store.acquire('k', { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT });
    await dropped;
    const woken = waiter.waitFor('k', 20_000).then(() => Date.now());
    await waitUntil(
      async () => (await redis.cli('GET', 'o:k')).startsWith('w'),
      'the lease marked by the waiter',
    );
    release();
    const result = await acquiring;
    expect(result).toEqual({ status: 'acquired', token: expect.any(String) });
    const { token } = result as { token: string };
    // The lease is still the waiter's mark and this call's token: the resend took it as its own, untouched.
    expect(await redis.cli('GET', 'o:k')).toBe(`w${token}`);
    const completedAt = Date.now();
    const body = new Uint8Array(Buffer.from('{"ok":true}'));
    expect(await store.complete('k', token, { status: 201, headers: {}, body }, 60_000)).toBe(true);
    // Woken by the completion's PUBLISH (the 'w' made it publish), not by its 20 s timeout.
    expect((await woken) - completedAt).toBeLessThan(10_000);
    expect(await waiter.acquire('k', { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT })).toMatchObject({
      status: 'completed',
    });
  });
});

/** `run`'s answer, retried while the client reconnects from the previous test's cut. */
async function answered<T>(run: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await run();
    } catch (error) {
      if (i >= 100) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

describe.each(
  CLIENT_KINDS.filter((kind) => kind.library === 'ioredis').map((kind) => [kind.name, kind] as const),
)('RedisStore with waitForReplicas on %s', (_name, kind) => {
  let primary: PrivateRedis;
  let replica: PrivateRedis;
  let proxy: Awaited<ReturnType<typeof startProxy>>;
  let connected: ConnectedClient;
  let store: RedisStore;

  beforeAll(async () => {
    primary = await startRedis();
    replica = await startRedis(['--replicaof', '127.0.0.1', String(primary.port)]);
    await waitUntil(
      async () => (await replica.cli('info', 'replication')).includes('master_link_status:up'),
      'the replica linked',
    );
    proxy = await startProxy(primary.port);
    connected = await kind.standalone(proxy.url, COMMAND_TIMEOUT);
    store = new RedisStore({
      client: connected.client,
      prefix: 'r:',
      waitForReplicas: { replicas: 1, timeout: 5_000 },
    });
  });
  afterAll(async () => {
    await store?.close();
    await connected?.close();
    await proxy?.close();
    await replica?.stop();
    await primary?.stop();
  });

  test('the acquire script, resent, finds its own lease: acquired (it was a conflict with itself), and the replica has it', async () => {
    // The script is loaded first: a dropped NOSCRIPT reply would be resent harmlessly, and test nothing.
    expect(await store.acquire('warm', { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT })).toMatchObject({
      status: 'acquired',
    });
    const dropped = proxy.dropNextReply();
    const acquiring = store.acquire('k', { fingerprint: 'fp', lockTimeoutMs: LOCK_TIMEOUT });
    await dropped;
    const result = await acquiring;
    expect(result).toEqual({ status: 'acquired', token: expect.any(String) });
    const { token } = result as { token: string };
    expect(await replica.cli('GET', 'r:k')).toBe(`p${token}`);
  });
});
