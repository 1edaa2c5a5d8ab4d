/**
 * @services redis-server
 */
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';
import { RedisReplicationError, RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// How RedisStore re-sends unconfirmed writes (waitForReplicas), on a private primary with one replica that is paused
// (SIGSTOP) to leave writes unconfirmed: what a re-send replicates, the TTL it leaves, the connection it blocks, what
// it leaves in flight against a hung primary, and how close() and a refused reservation's release take part.
// unconfirmed.test.ts has the outcomes themselves, failover-unconfirmed.test.ts the failover.
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

const response = (body: Buffer | string) => ({
  status: 201,
  headers: {},
  body: typeof body === 'string' ? Buffer.from(body) : body,
});

async function unconfirmed(call: () => Promise<unknown>): Promise<RedisReplicationError> {
  try {
    await call();
  } catch (error) {
    if (error instanceof RedisReplicationError) return error;
    throw error;
  }
  throw new Error('expected a RedisReplicationError');
}

const info = async (server: PrivateRedis, section: string, field: string): Promise<number> => {
  const match = new RegExp(`${field}:(\\d+)`).exec(await server.cli('info', section));
  return match === null ? 0 : Number(match[1]);
};
/** How many times the primary ran `command` (0 before the first). */
const calls = async (command: string): Promise<number> => {
  const match = new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(await primary.cli('info', 'commandstats'));
  return match === null ? 0 : Number(match[1]);
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** The outcome, or 'pending' if it has not ended within `ms`. */
const within = <T>(promise: Promise<T> | undefined, ms: number) =>
  Promise.race([promise, sleep(ms).then(() => 'pending' as const)]);

// One client of each library: the re-sends go out on a connection the store makes from the user's client.
describe.each(
  CLIENT_KINDS.filter((kind) => kind.name === 'ioredis 5' || kind.name === 'node-redis 6').map(
    (kind) => [kind.name, kind] as const,
  ),
)('on %s', (name, kind) => {
  const tag = `rounds-${name.replace(' ', '-')}`;
  let connected: ConnectedClient;
  let stores: RedisStore[] = [];

  beforeEach(async () => {
    connected = await kind.standalone(primary.url, 1000);
  });
  afterEach(async () => {
    replica.resume();
    primary.resume();
    await Promise.all(stores.map((store) => store.close()));
    stores = [];
    await connected.close();
  });

  const storeFor = (test: string, timeoutMs = 200) => {
    const store = new RedisStore({
      client: connected.client,
      prefix: `${tag}-${test}:`,
      waitForReplicas: { replicas: 1, timeout: timeoutMs },
    });
    stores.push(store);
    return store;
  };
  const acquire = async (store: RedisStore, key: string) => {
    const acquired = await store.acquire(key, { fingerprint: 'f', lockTimeoutMs: LEASE_MS });
    if (acquired.status !== 'acquired') throw new Error(`expected acquired, got ${acquired.status}`);
    return acquired.token;
  };

  test('a re-send of a completion already on the primary replicates a few bytes, not the record again', async () => {
    const store = storeFor('amp');
    const body = Buffer.alloc(256 * 1024, 120);
    const tokens = [await acquire(store, 'a'), await acquire(store, 'b')];
    replica.pause();
    const errors = await Promise.all(
      tokens.map((token, i) =>
        unconfirmed(() => store.complete(`${'ab'[i]}`, token, response(body), 60_000)),
      ),
    );
    const before = await info(primary, 'replication', 'master_repl_offset');
    await sleep(2500); // four rounds of re-sends or more
    const grown = (await info(primary, 'replication', 'master_repl_offset')) - before;
    replica.resume();
    expect(await Promise.all(errors.map((error) => error.confirmation))).toEqual(['confirmed', 'confirmed']);
    // Each round's write is a SETRANGE of one byte per key; a full record would be 256 KiB each.
    expect(grown).toBeLessThan(64 * 1024);
    expect(
      (await replica.cli('strlen', `${tag}-amp:a`)) === (await primary.cli('strlen', `${tag}-amp:a`)),
    ).toBe(true);
  });

  test('re-sent, a completion keeps the TTL counted from its first write and ends as expired when it runs out', async () => {
    const store = storeFor('ttl');
    const token = await acquire(store, 'k');
    replica.pause();
    const error = await unconfirmed(() => store.complete('k', token, response('done'), 3000));
    await sleep(1500);
    // Re-sends rewriting the record with the whole TTL would keep it near 3000 ms.
    expect(Number(await primary.cli('pttl', `${tag}-ttl:k`))).toBeLessThan(2000);
    // The replica is still paused: nothing confirms it, and the record expires on time.
    expect(await within(error.confirmation, 5000)).toBe('expired');
    expect(await primary.cli('exists', `${tag}-ttl:k`)).toBe('0');
  });

  test('a re-send that lands on the lease writes the record for what is left of its TTL', async () => {
    const store = storeFor('lease');
    const token = await acquire(store, 'k');
    replica.pause();
    const error = await unconfirmed(() => store.complete('k', token, response('done'), 60_000));
    // What a replica promoted without the completion holds: this token's lease.
    await primary.cli('set', `${tag}-lease:k`, `p${token}`, 'px', String(LEASE_MS));
    await sleep(1500);
    await waitUntil(
      async () => (await primary.cli('getrange', `${tag}-lease:k`, '0', '0')) === 'c',
      'the re-sent record',
    );
    expect(Number(await primary.cli('pttl', `${tag}-lease:k`))).toBeLessThanOrEqual(60_000 - 1500);
    replica.resume();
    expect(await error.confirmation).toBe('confirmed');
  });

  test("pending re-sends never block the user's connection with their WAITs, and their connection is closed after", async () => {
    // A WAIT of 3 s against a bound of 1.5 s: a GET queued behind one waits far longer than a loaded machine
    // stalls. The client's command timeout must outlast the WAIT.
    await connected.close();
    connected = await kind.standalone(primary.url, 5000);
    const store = storeFor('block', 3000);
    const clientsBefore = await info(primary, 'clients', 'connected_clients');
    const tokens = await Promise.all(Array.from({ length: 10 }, (_, i) => acquire(store, `k${i}`)));
    replica.pause();
    let errors: RedisReplicationError[];
    const slowest: number[] = [];
    try {
      errors = await Promise.all(
        tokens.map((token, i) => unconfirmed(() => store.complete(`k${i}`, token, response('x'), 60_000))),
      );
      const user = connected.client as unknown as { get(key: string): Promise<unknown> };
      for (let i = 0; i < 6; i++) {
        await sleep(300);
        const started = performance.now();
        await user.get(`${tag}-block:nothing`);
        slowest.push(performance.now() - started);
      }
    } finally {
      replica.resume();
    }
    // Behind a re-send's WAIT (3 s, the replica paused), a GET would wait for it.
    expect(Math.max(...slowest)).toBeLessThan(1500);
    expect(new Set(await Promise.all(errors.map((error) => error.confirmation)))).toEqual(
      new Set(['confirmed']),
    );
    await waitUntil(
      async () => (await info(primary, 'clients', 'connected_clients')) === clientsBefore,
      'the re-sending connection to close',
    );
  });

  // ioredis keeps a command that timed out queued until its reply comes (node-redis's socket timeout closes the
  // connection and drops what is in flight): re-sends on it would pile up, each with the whole record.
  const ioredisOnly = kind.library === 'ioredis' ? test : test.skip;
  ioredisOnly('against a hung primary, each write has one try in flight at a time', async () => {
    const store = storeFor('hung');
    const K = 4;
    const tokens = await Promise.all(Array.from({ length: K }, (_, i) => acquire(store, `k${i}`)));
    const body = Buffer.alloc(64 * 1024, 120);
    const before = (await calls('evalsha')) + (await calls('eval'));
    primary.pause();
    let errors: RedisReplicationError[];
    try {
      errors = await Promise.all(
        tokens.map((token, i) => unconfirmed(() => store.complete(`k${i}`, token, response(body), 60_000))),
      );
      await sleep(6000);
    } finally {
      primary.resume();
    }
    expect(new Set(await Promise.all(errors.map((error) => error.confirmation)))).toEqual(
      new Set(['confirmed']),
    );
    // The completions themselves, a round in flight when it hung, and the rounds that confirmed them once it was
    // back: re-sends piling up at every interval (0.1 s, 0.2 s... 1 s) would be eight or more per write.
    const ran = (await calls('evalsha')) + (await calls('eval')) - before;
    expect(ran).toBeLessThanOrEqual(5 * K);
  });

  test('close() gives pending re-sends a last chance: a partition that heals meanwhile ends confirmed', async () => {
    const store = storeFor('close');
    const token = await acquire(store, 'k');
    replica.pause();
    const error = await unconfirmed(() => store.complete('k', token, response('done'), 60_000));
    const healed = sleep(300).then(() => replica.resume());
    await store.close();
    await healed;
    expect(await error.confirmation).toBe('confirmed');
    expect(await replica.cli('getrange', `${tag}-close:k`, '0', '0')).toBe('c');
  });

  test("a refused reservation's release is confirmed too (WAITs follow it until the replica has it)", async () => {
    const store = storeFor('undo');
    const waitsBefore = await calls('wait');
    replica.pause();
    try {
      await expect(store.acquire('k', { fingerprint: 'f', lockTimeoutMs: LEASE_MS })).rejects.toMatchObject({
        operation: 'acquire',
      });
      await sleep(500);
    } finally {
      replica.resume();
    }
    // The reservation's WAIT, then the release's and its re-sends'; a plain release has none.
    await waitUntil(async () => (await calls('wait')) - waitsBefore >= 3, 'WAITs behind the release');
    expect(await primary.cli('exists', `${tag}-undo:k`)).toBe('0');
    await waitUntil(async () => (await replica.cli('exists', `${tag}-undo:k`)) === '0', 'the replica');
  });
});
