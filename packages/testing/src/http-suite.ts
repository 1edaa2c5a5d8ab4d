import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { type IdempotencyStore, scopeByHeader } from '@oncely/core';
import request from 'supertest';
import { binaryParser, expectLeavingClientReleased, http1Post } from './harness-helpers';
import { handlerFailuresSuite } from './http-suite-failures';
import { nestedRegistrationsSuite } from './http-suite-nested';
import { stepsSuite } from './http-suite-steps';
import {
  type AdapterHarness,
  type RedisClientLike,
  recordingLogger,
  type TestApp,
  type TestAppOptions,
} from './suite-types';

export {
  type AdapterHarness,
  type KnownGap,
  type NestedHarness,
  type RedisClientLike,
  recordingLogger,
  type TestApp,
  type TestAppOptions,
  type TestRequest,
} from './suite-types';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export function expectedBinary(): Buffer {
  const body = Buffer.alloc(1024);
  for (let i = 0; i < body.length; i++) body[i] = i % 256;
  return body;
}

export function expectedStream(): Buffer {
  const body = Buffer.alloc(10_000);
  for (let i = 0; i < body.length; i++) body[i] = (i * 7) % 256;
  return body;
}

/** `expectedStream()` as the web stream a fetch handler returns: 10 chunks of 1000 bytes, a turn of the event loop apart. */
export function expectedWebStream(): ReadableStream<Uint8Array> {
  const bytes = expectedStream();
  let i = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (i === 10) return controller.close();
      await new Promise((resolve) => setImmediate(resolve));
      controller.enqueue(bytes.subarray(i * 1000, ++i * 1000));
    },
  });
}

/** Sends a POST whose Idempotency-Key header is exactly `keyBytes`, bypassing client-side header checks. */
function rawPost(url: string, path: string, keyBytes: Buffer): Promise<number> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      socket.write(
        Buffer.concat([
          Buffer.from(
            `POST ${path} HTTP/1.1\r\nHost: ${hostname}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\nIdempotency-Key: `,
          ),
          keyBytes,
          Buffer.from('\r\n\r\n{}'),
        ]),
      );
    });
    let head = '';
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => {
      head += data;
      const match = /^HTTP\/1\.1 (\d{3})/.exec(head);
      if (match) {
        resolve(Number(match[1]));
        socket.destroy();
      }
    });
    socket.on('error', reject);
    socket.on('close', () =>
      reject(new Error(`connection closed without a status line: ${JSON.stringify(head)}`)),
    );
  });
}

/** A store whose every call fails, as a store that is down would. */
export function brokenStore(): IdempotencyStore {
  const down = () => Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:6379'));
  return { acquire: down, complete: down, release: down, renew: down };
}

/**
 * The same harness with every app on `store()` (unless a test gives its own store, such as a broken one), so the
 * whole suite runs on a shared store: `httpBehaviourSuite(onStore(harness, 'RedisStore', () => redisStore))`.
 */
export function onStore(
  harness: AdapterHarness,
  storeName: string,
  store: () => IdempotencyStore,
): AdapterHarness {
  return {
    name: `${harness.name} on ${storeName}`,
    create: (options) =>
      harness.create(options.store === undefined ? { ...options, store: store() } : options),
    store,
    nested: {
      rule: harness.nested.rule,
      create: (outer, inner) =>
        harness.nested.create(outer.store === undefined ? { ...outer, store: store() } : outer, inner),
    },
    ...(harness.knownGaps === undefined ? {} : { knownGaps: harness.knownGaps }),
  };
}

/**
 * Runs the whole suite for each harness on a store of its own made by `makeStore` over one client from `connect`,
 * each under a random key prefix (a few suite tests use fixed keys, which another run on the same Redis would have
 * stored). After all tests: the stores are closed, every key of the prefixes deleted, the client quit.
 */
export function httpSuiteOnRedis<Client extends RedisClientLike>(
  harnesses: readonly AdapterHarness[],
  connect: () => Client,
  makeStore: (client: Client, prefix: string) => IdempotencyStore & { close(): Promise<void> },
): void {
  const client = connect();
  const prefix = `oncely-suite:${randomUUID()}:`;
  const stores = harnesses.map((_harness, i) => makeStore(client, `${prefix}${i}:`));
  afterAll(async () => {
    await Promise.all(stores.map((store) => store.close()));
    const keys = await client.keys(`${prefix}*`);
    if (keys.length > 0) await client.del(...keys);
    await client.quit();
  });
  harnesses.forEach((harness, i) => {
    httpBehaviourSuite(onStore(harness, 'RedisStore', () => stores[i] as IdempotencyStore));
  });
}

/** The HTTP behaviour docs/semantics.md describes, identical for every adapter. */
export function httpBehaviourSuite(harness: AdapterHarness): void {
  describe(`${harness.name}: HTTP behaviour`, () => {
    const apps: TestApp[] = [];
    const make = async (options: TestAppOptions = {}) => {
      const app = await harness.create(options);
      apps.push(app);
      return app;
    };
    afterEach(async () => {
      await Promise.all(apps.splice(0).map((app) => app.close()));
    });
    const newKey = () => `key-${randomUUID()}`;

    describe('requests the middleware leaves alone', () => {
      test('methods not covered run as if there were no middleware, key or not', async () => {
        const app = await make();
        const key = newKey();
        for (const method of ['get', 'delete'] as const) {
          const first = await request(app.url)[method]('/charges').set('Idempotency-Key', key);
          const second = await request(app.url)[method]('/charges').set('Idempotency-Key', key);
          expect(first.status).toBe(200);
          expect(second.status).toBe(200);
          expect(second.headers['idempotent-replayed']).toBeUndefined();
        }
        expect(app.count('charges')).toBe(4);
      });

      test('no key and not required: the handler runs every time', async () => {
        const app = await make();
        await request(app.url).post('/charges').send({ amount: 1 }).expect(201);
        await request(app.url).post('/charges').send({ amount: 1 }).expect(201);
        expect(app.count('charges')).toBe(2);
      });

      test('the methods option changes what is covered', async () => {
        const app = await make({ methods: ['DELETE'] });
        const key = newKey();
        await request(app.url).delete('/charges').set('Idempotency-Key', key).expect(200);
        const replay = await request(app.url).delete('/charges').set('Idempotency-Key', key).expect(200);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({}).expect(201);
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({}).expect(201);
        expect(app.count('charges')).toBe(3);
      });
    });

    describe('bad keys get a 400 problem and never run the handler', () => {
      test('key absent and required: 400 problem+json', async () => {
        const app = await make({ required: true });
        const res = await request(app.url).post('/charges').send({ amount: 1 });
        expect(res.status).toBe(400);
        expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(res.body).toMatchObject({
          type: 'https://oncely.dev/problems/key-missing',
          title: expect.any(String),
          status: 400,
          detail: expect.stringContaining('idempotency-key'),
        });
        expect(app.count('charges')).toBe(0);
      });

      test.each([
        ['empty', ''],
        ['only spaces', '   '],
        ['too long (256)', 'k'.repeat(256)],
        ['inner space', 'a b'],
        ['a tab', 'a\tb'],
        ['latin-1 bytes', Buffer.from('caf\u00e9', 'latin1').toString('latin1')],
        ['two values joined by a proxy', 'abc, def'],
        ['an unterminated RFC 8941 string', '"abc'],
        ['a bad escape in an RFC 8941 string', '"a\\x"'],
        ['text after an RFC 8941 string', '"abc"def'],
        ['an empty RFC 8941 string', '""'],
        ['16 KiB of junk', 'x'.repeat(16_000)],
      ])('%s: 400 key-invalid', async (_label, value) => {
        const app = await make();
        const res = await request(app.url).post('/charges').set('Idempotency-Key', value).send({ amount: 1 });
        if (value.length > 8000) {
          // Node's own header limit may answer 431 before any middleware; either way, no execution.
          expect([400, 431]).toContain(res.status);
        } else {
          expect(res.status).toBe(400);
          expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
          expect(res.body.type).toBe('https://oncely.dev/problems/key-invalid');
        }
        expect(app.count('charges')).toBe(0);
      });

      test('a key of exactly maxKeyLength is accepted; maxKeyLength is configurable', async () => {
        const app = await make({ maxKeyLength: 10 });
        await request(app.url).post('/charges').set('Idempotency-Key', 'k'.repeat(10)).send({}).expect(201);
        await request(app.url).post('/charges').set('Idempotency-Key', 'k'.repeat(11)).send({}).expect(400);
        expect(app.count('charges')).toBe(1);
      });

      test('raw hostile header bytes get a 4xx, never a crash or an execution', async () => {
        const app = await make();
        const hostile = [
          Buffer.from([0x7f]),
          Buffer.from([0x01, 0x02]),
          Buffer.from('k\x00ey', 'latin1'),
          Buffer.from([0xff, 0xfe, 0x80]),
          Buffer.from('caf\u00e9', 'utf8'),
          Buffer.from('"\\"'),
          Buffer.from('"'.repeat(100)),
        ];
        for (const value of hostile) {
          const status = await rawPost(app.url, '/charges', value);
          expect(status).toBeGreaterThanOrEqual(400);
          expect(status).toBeLessThan(500);
        }
        expect(app.count('charges')).toBe(0);
        await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({}).expect(201);
        expect(app.count('charges')).toBe(1);
      });
    });

    describe('first request, replay', () => {
      test('the handler runs once; the replay is the same status, headers and body, byte for byte', async () => {
        const app = await make();
        const key = newKey();
        const first = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 42 });
        expect(first.status).toBe(201);
        expect(first.headers['idempotent-replayed']).toBeUndefined();
        const replay = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 42 });
        expect(replay.status).toBe(201);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.text).toBe(first.text);
        expect(JSON.parse(replay.text)).toEqual({ id: 1, amount: 42 });
        expect(replay.headers['x-charge-id']).toBe(first.headers['x-charge-id']);
        expect(replay.headers['content-type']).toBe(first.headers['content-type']);
        expect(replay.headers['content-length']).toBe(String(Buffer.byteLength(first.text)));
        expect(app.count('charges')).toBe(1);
      });

      test('an RFC 8941 quoted key names the same record as the bare key', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(201);
        const replay = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', `"${key}"`)
          .send({ amount: 1 });
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(app.count('charges')).toBe(1);
      });

      test('the header name is case-insensitive and configurable', async () => {
        const app = await make({ header: 'X-Request-Key' });
        const key = newKey();
        await request(app.url).post('/charges').set('x-request-key', key).send({}).expect(201);
        const replay = await request(app.url).post('/charges').set('X-REQUEST-KEY', key).send({});
        expect(replay.headers['idempotent-replayed']).toBe('true');
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({}).expect(201);
        expect(app.count('charges')).toBe(2);
      });

      test('Set-Cookie and Date are never replayed', async () => {
        const app = await make();
        const key = newKey();
        const first = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(first.headers['set-cookie']).toEqual(['session=1']);
        await sleep(1100); // let the Date header tick
        const replay = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.headers['set-cookie']).toBeUndefined();
        expect(replay.headers.date).toBeDefined();
        expect(replay.headers.date).not.toBe(first.headers.date);
      });

      test('excludeHeaders keeps more headers out of the replay', async () => {
        const app = await make({ excludeHeaders: ['X-Charge-Id'] });
        const key = newKey();
        const first = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(first.headers['x-charge-id']).toBe('1');
        const replay = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.headers['x-charge-id']).toBeUndefined();
      });

      test.each([
        ['/binary', 'binary', expectedBinary],
        ['/stream', 'stream', expectedStream],
      ])('%s: replays byte for byte', async (path, route, expected) => {
        const app = await make();
        const key = newKey();
        const first = await request(app.url)
          .post(path)
          .set('Idempotency-Key', key)
          .buffer(true)
          .parse(binaryParser);
        expect(first.status).toBe(200);
        expect(Buffer.compare(first.body as Buffer, expected())).toBe(0);
        const replay = await request(app.url)
          .post(path)
          .set('Idempotency-Key', key)
          .buffer(true)
          .parse(binaryParser);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.headers['content-type']).toBe('application/octet-stream');
        expect(Buffer.compare(replay.body as Buffer, expected())).toBe(0);
        expect(replay.headers['content-length']).toBe(String(expected().length));
        expect(app.count(route)).toBe(1);
      });

      test('a UTF-8 string body replays byte for byte', async () => {
        const app = await make();
        const key = newKey();
        const first = await request(app.url).post('/text').set('Idempotency-Key', key);
        const replay = await request(app.url).post('/text').set('Idempotency-Key', key);
        expect(first.text).toBe('héllo wörld ✓');
        expect(replay.text).toBe('héllo wörld ✓');
        expect(replay.headers['content-type']).toBe(first.headers['content-type']);
        expect(app.count('text')).toBe(1);
      });

      test('the handler can read the key it runs under (unquoted)', async () => {
        const app = await make();
        const key = newKey();
        const res = await request(app.url).post('/key').set('Idempotency-Key', `"${key}"`).send({});
        expect(res.body).toEqual({ key });
        const none = await request(app.url).post('/key').send({});
        expect(none.body).toEqual({ key: null });
      });
    });

    describe('concurrent duplicates', () => {
      test('same key while the first still runs: 409 with Retry-After, handler not run again', async () => {
        const app = await make();
        const key = newKey();
        const first = request(app.url)
          .post('/charges?delay=400')
          .set('Idempotency-Key', key)
          .send({})
          .then((r) => r);
        await sleep(100);
        const second = await request(app.url).post('/charges?delay=400').set('Idempotency-Key', key).send({});
        expect(second.status).toBe(409);
        expect(second.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(second.body.type).toBe('https://oncely.dev/problems/request-in-progress');
        expect(second.headers['retry-after']).toBe('1');
        expect((await first).status).toBe(201);
        expect(app.count('charges')).toBe(1);
      });

      test('inProgressStatus: 429 answers 429 instead', async () => {
        const app = await make({ inProgressStatus: 429 });
        const key = newKey();
        const first = request(app.url)
          .post('/charges?delay=300')
          .set('Idempotency-Key', key)
          .send({})
          .then((r) => r);
        await sleep(100);
        const second = await request(app.url).post('/charges?delay=300').set('Idempotency-Key', key).send({});
        expect(second.status).toBe(429);
        expect(second.headers['retry-after']).toBeDefined();
        await first;
      });

      test('50 simultaneous duplicates: exactly one execution; the others 409 or a replay of it', async () => {
        const app = await make();
        const key = newKey();
        const responses = await Promise.all(
          Array.from({ length: 50 }, () =>
            request(app.url).post('/charges?delay=50').set('Idempotency-Key', key).send({ amount: 7 }),
          ),
        );
        expect(app.count('charges')).toBe(1);
        const ok = responses.filter((r) => r.status === 201);
        const conflicts = responses.filter((r) => r.status === 409);
        expect(ok.length + conflicts.length).toBe(50);
        expect(ok.filter((r) => r.headers['idempotent-replayed'] === undefined)).toHaveLength(1);
        for (const r of ok) expect(r.body).toEqual({ id: 1, amount: 7 });
      });

      test('wait mode: 50 simultaneous duplicates all get the one response', async () => {
        const app = await make({ inProgress: { wait: '10s' } });
        const key = newKey();
        const responses = await Promise.all(
          Array.from({ length: 50 }, () =>
            request(app.url).post('/charges?delay=200').set('Idempotency-Key', key).send({ amount: 8 }),
          ),
        );
        expect(app.count('charges')).toBe(1);
        for (const r of responses) {
          expect(r.status).toBe(201);
          expect(r.body).toEqual({ id: 1, amount: 8 });
        }
        expect(responses.filter((r) => r.headers['idempotent-replayed'] === 'true')).toHaveLength(49);
      });

      test('wait mode: a wait that runs out answers 409', async () => {
        const app = await make({ inProgress: { wait: 150 } });
        const key = newKey();
        const first = request(app.url)
          .post('/charges?delay=1000')
          .set('Idempotency-Key', key)
          .send({})
          .then((r) => r);
        await sleep(100);
        const second = await request(app.url)
          .post('/charges?delay=1000')
          .set('Idempotency-Key', key)
          .send({});
        expect(second.status).toBe(409);
        expect((await first).status).toBe(201);
        expect(app.count('charges')).toBe(1);
      });

      test('wait mode: when the first fails, a waiter takes the key and runs the handler itself', async () => {
        const app = await make({ inProgress: { wait: '5s' } });
        const key = newKey();
        const [a, b] = await Promise.all([
          request(app.url).post('/status/503?delay=300').set('Idempotency-Key', key).send({}),
          sleep(100).then(() =>
            request(app.url).post('/status/503?delay=300').set('Idempotency-Key', key).send({}),
          ),
        ]);
        expect(a.status).toBe(503);
        expect(b.status).toBe(503);
        expect(b.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('status')).toBe(2);
      });
    });

    describe('the fingerprint', () => {
      test('same key, different body: 422, and the stored record stays as it was', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 }).expect(201);
        const mismatch = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 2 });
        expect(mismatch.status).toBe(422);
        expect(mismatch.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(mismatch.body.type).toBe('https://oncely.dev/problems/key-reused');
        const replay = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 1 });
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.body).toEqual({ id: 1, amount: 1 });
        expect(app.count('charges')).toBe(1);
      });

      test('same key, different path or query: 422', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({}).expect(201);
        await request(app.url).post('/charges?delay=1').set('Idempotency-Key', key).send({}).expect(422);
        await request(app.url).post('/text').set('Idempotency-Key', key).send({}).expect(422);
        expect(app.count('charges')).toBe(1);
        expect(app.count('text')).toBe(0);
      });

      test('same key, different body while the first still runs: 422', async () => {
        const app = await make();
        const key = newKey();
        const first = request(app.url)
          .post('/charges?delay=300')
          .set('Idempotency-Key', key)
          .send({ amount: 1 })
          .then((r) => r);
        await sleep(100);
        await request(app.url)
          .post('/charges?delay=300')
          .set('Idempotency-Key', key)
          .send({ amount: 2 })
          .expect(422);
        await first;
      });

      test('JSON key order does not matter', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('content-type', 'application/json')
          .send('{"amount":5,"currency":"eur"}');
        const replay = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('content-type', 'application/json')
          .send('{ "currency": "eur", "amount": 5 }');
        expect(replay.status).toBe(201);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(app.count('charges')).toBe(1);
      });

      test('fingerprint: false disables the check; a custom fingerprint replaces it', async () => {
        const off = await make({ fingerprint: false });
        const key = newKey();
        await request(off.url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 });
        const replay = await request(off.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .send({ amount: 2 });
        expect(replay.headers['idempotent-replayed']).toBe('true');

        const custom = await make({ fingerprint: (req) => String(req.headers['x-version'] ?? '') });
        // A key of its own: with a shared store (onStore) the first app's record would answer for the old one.
        const customKey = newKey();
        await request(custom.url)
          .post('/charges')
          .set('Idempotency-Key', customKey)
          .set('x-version', '1')
          .send({ amount: 1 });
        const sameVersion = await request(custom.url)
          .post('/charges')
          .set('Idempotency-Key', customKey)
          .set('x-version', '1')
          .send({ amount: 9 });
        expect(sameVersion.headers['idempotent-replayed']).toBe('true');
        await request(custom.url)
          .post('/charges')
          .set('Idempotency-Key', customKey)
          .set('x-version', '2')
          .send({ amount: 1 })
          .expect(422);
      });
    });

    describe('failures release the key', () => {
      test('a non-cacheable status (5xx) releases the key: the retry runs again', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/status/500').set('Idempotency-Key', key).send({}).expect(500);
        const retry = await request(app.url).post('/status/500').set('Idempotency-Key', key).send({});
        expect(retry.status).toBe(500);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('status')).toBe(2);
      });

      test('a 4xx is cacheable by default and replays', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/status/404').set('Idempotency-Key', key).send({}).expect(404);
        const replay = await request(app.url).post('/status/404').set('Idempotency-Key', key).send({});
        expect(replay.status).toBe(404);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(app.count('status')).toBe(1);
      });

      test('cacheable decides what is stored', async () => {
        const app = await make({ cacheable: (status) => status < 400 });
        const key = newKey();
        await request(app.url).post('/status/404').set('Idempotency-Key', key).send({}).expect(404);
        await request(app.url).post('/status/404').set('Idempotency-Key', key).send({}).expect(404);
        expect(app.count('status')).toBe(2);
      });

      test.each([
        ['a thrown error', '/throw', 'throw', 500],
        ['a thrown error the error handler maps to 400', '/throw?status=400', 'throw', 400],
        ['an error handed to the framework asynchronously', '/reject', 'reject', 500],
      ])('%s releases the key: the retry runs again', async (_label, path, route, status) => {
        const app = await make();
        const key = newKey();
        await request(app.url).post(path).set('Idempotency-Key', key).send({}).expect(status);
        const retry = await request(app.url).post(path).set('Idempotency-Key', key).send({});
        expect(retry.status).toBe(status);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count(route)).toBe(2);
      });
    });

    describe('expiry and size limits', () => {
      test('a completed record older than ttl is treated as new', async () => {
        const app = await make({ ttl: 150 });
        const key = newKey();
        await request(app.url).post('/charges').set('Idempotency-Key', key).send({}).expect(201);
        const replay = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(replay.headers['idempotent-replayed']).toBe('true');
        await sleep(400);
        const fresh = await request(app.url).post('/charges').set('Idempotency-Key', key).send({});
        expect(fresh.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('charges')).toBe(2);
      });

      test('a response larger than maxBodyBytes is sent whole, never re-executed, and replays as 410', async () => {
        const app = await make({ maxBodyBytes: 1000 });
        const key = newKey();
        const first = await request(app.url).post('/big?size=5000').set('Idempotency-Key', key).send({});
        expect(first.status).toBe(200);
        expect(first.text).toHaveLength(5000);
        const replay = await request(app.url).post('/big?size=5000').set('Idempotency-Key', key).send({});
        expect(replay.status).toBe(410);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.body).toMatchObject({
          type: 'https://oncely.dev/problems/response-not-stored',
          originalStatus: 200,
        });
        expect(app.count('big')).toBe(1);
        // At the limit it is still stored.
        const small = newKey();
        await request(app.url).post('/big?size=1000').set('Idempotency-Key', small).send({});
        const smallReplay = await request(app.url)
          .post('/big?size=1000')
          .set('Idempotency-Key', small)
          .send({});
        expect(smallReplay.status).toBe(200);
        expect(smallReplay.text).toHaveLength(1000);
      });

      test('a streamed response larger than maxBodyBytes streams through whole', async () => {
        const app = await make({ maxBodyBytes: 3000 });
        const key = newKey();
        const first = await request(app.url)
          .post('/stream')
          .set('Idempotency-Key', key)
          .buffer(true)
          .parse(binaryParser);
        expect(Buffer.compare(first.body as Buffer, expectedStream())).toBe(0);
        const replay = await request(app.url).post('/stream').set('Idempotency-Key', key);
        expect(replay.status).toBe(410);
        expect(app.count('stream')).toBe(1);
      });
    });

    describe('bodiless statuses', () => {
      test('a 204 replays without a body and without Content-Length', async () => {
        const app = await make();
        const key = newKey();
        await request(app.url).post('/status/204').set('Idempotency-Key', key).send({}).expect(204);
        const replay = await request(app.url).post('/status/204').set('Idempotency-Key', key).send({});
        expect(replay.status).toBe(204);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.headers['content-length']).toBeUndefined();
        expect(app.count('status')).toBe(1);
      });
    });

    describe('scope', () => {
      test('the same key in two scopes is two records', async () => {
        const app = await make({ scope: (req) => String(req.headers['x-tenant'] ?? 'anonymous') });
        const key = newKey();
        const a = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('x-tenant', 'a')
          .send({});
        const b = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('x-tenant', 'b')
          .send({});
        expect(b.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('charges')).toBe(2);
        const replayA = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('x-tenant', 'a')
          .send({});
        const replayB = await request(app.url)
          .post('/charges')
          .set('Idempotency-Key', key)
          .set('x-tenant', 'b')
          .send({});
        expect(replayA.body).toEqual(a.body);
        expect(replayB.body).toEqual(b.body);
        expect(replayA.body).not.toEqual(replayB.body);
        expect(app.count('charges')).toBe(2);
      });

      test('a scope that is not a string (an async scope, undefined) is refused, never merged', async () => {
        const logger = recordingLogger();
        const app = await make({ logger, scope: (async () => 'tenant') as unknown as () => string });
        const res = await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({});
        expect(res.status).toBe(500);
        expect(res.body.type).toBe('https://oncely.dev/problems/internal-error');
        expect(app.count('charges')).toBe(0);
        expect(logger.lines.some((l) => l.level === 'error')).toBe(true);
      });

      test('a scope function that throws answers a 500 problem and does not run the handler', async () => {
        const logger = recordingLogger();
        const app = await make({
          logger,
          scope: () => {
            throw new Error('no user');
          },
        });
        const res = await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({});
        expect(res.status).toBe(500);
        expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(app.count('charges')).toBe(0);
        expect(logger.lines.some((l) => l.level === 'error')).toBe(true);
      });
    });

    describe('credentials without a scope (docs/security.md)', () => {
      const unscopedWarnings = (logger: ReturnType<typeof recordingLogger>) =>
        logger.lines.filter((l) => l.level === 'warn' && /without a scope/.test(l.msg ?? ''));

      test('one warning, naming the header, for requests with Authorization or Cookie; none after', async () => {
        const logger = recordingLogger();
        const app = await make({ logger });
        const requests: [string, string][] = [
          ['Authorization', 'Bearer token-of-user-a'],
          ['Cookie', 'session=abc'],
          ['Authorization', 'Bearer token-of-user-b'],
        ];
        for (const [name, value] of requests) {
          await request(app.url).post('/charges').set(name, value).set('Idempotency-Key', newKey()).send({});
        }
        const warnings = unscopedWarnings(logger);
        expect(warnings).toHaveLength(1);
        expect(warnings[0]?.obj.header).toBe('authorization');
        expect(JSON.stringify(logger.lines)).not.toContain('token-of-user');
      });

      test('no warning with scope: false, with a scope, or for requests without credentials', async () => {
        for (const options of [{ scope: false as const }, { scope: () => 'tenant-1' }, {}]) {
          const logger = recordingLogger();
          const app = await make({ logger, ...options });
          const credentials = options.scope === undefined ? {} : { Authorization: 'Bearer t', Cookie: 'a=b' };
          await request(app.url).post('/charges').set(credentials).set('Idempotency-Key', newKey()).send({});
          expect(unscopedWarnings(logger)).toEqual([]);
        }
      });

      test('scopeByHeader: two API keys sending one key are two records; a retry replays its own', async () => {
        const app = await make({
          scope: scopeByHeader('authorization', { secret: 'http-suite-secret-0123456789' }),
        });
        const key = newKey();
        const send = (apiKey: string) =>
          request(app.url).post('/charges').set('Authorization', apiKey).set('Idempotency-Key', key).send({});
        const a = await send('Bearer sk_A');
        const b = await send('Bearer sk_B');
        const retryA = await send('Bearer sk_A');
        expect(b.headers['idempotent-replayed']).toBeUndefined();
        expect(b.body).not.toEqual(a.body);
        expect(retryA.headers['idempotent-replayed']).toBe('true');
        expect(retryA.body).toEqual(a.body);
        expect(app.count('charges')).toBe(2);
      });
    });

    describe('a store that is down', () => {
      test('fail-closed (default): 503 problem with Retry-After, handler not run, an error logged', async () => {
        const logger = recordingLogger();
        const app = await make({ store: brokenStore(), logger });
        const res = await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({});
        expect(res.status).toBe(503);
        expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(res.body.type).toBe('https://oncely.dev/problems/store-unavailable');
        expect(res.headers['retry-after']).toBe('1');
        expect(app.count('charges')).toBe(0);
        expect(logger.lines.some((l) => l.level === 'error')).toBe(true);
      });

      test('fail-open: the handler runs unprotected and a warning is logged', async () => {
        const logger = recordingLogger();
        const app = await make({ store: brokenStore(), logger, onStoreError: 'fail-open' });
        await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({}).expect(201);
        expect(app.count('charges')).toBe(1);
        expect(logger.lines.some((l) => l.level === 'warn' && /fail-open/.test(l.msg ?? ''))).toBe(true);
      });

      test('without a key, a down store is never asked: the handler runs', async () => {
        const app = await make({ store: brokenStore() });
        await request(app.url).post('/charges').send({}).expect(201);
        expect(app.count('charges')).toBe(1);
      });
    });

    describe('a client that leaves', () => {
      test('while the store is asked: the handler does not run, and the key is released for its retry', () =>
        expectLeavingClientReleased(async (options) => {
          const app = await make(options);
          return {
            leave: async (key, asked) => {
              await http1Post(app.url, '/charges', { 'idempotency-key': key }, { leaveWhen: asked });
            },
            retry: (key) => http1Post(app.url, '/charges', { 'idempotency-key': key }),
            runs: () => app.count('charges'),
          };
        }, harness.store?.()));
    });

    describe('hooks', () => {
      test('miss, hit, conflict, mismatch and release are reported', async () => {
        const events: string[] = [];
        const app = await make({
          hooks: {
            onMiss: () => events.push('miss'),
            onHit: () => events.push('hit'),
            onConflict: () => events.push('conflict'),
            onMismatch: () => events.push('mismatch'),
            onComplete: (e) => events.push(`complete:${e.status}`),
            onRelease: (e) => events.push(`release:${e.reason}`),
          },
        });
        const key = newKey();
        const first = request(app.url)
          .post('/charges?delay=200')
          .set('Idempotency-Key', key)
          .send({})
          .then((r) => r);
        await sleep(80);
        await request(app.url).post('/charges?delay=200').set('Idempotency-Key', key).send({}).expect(409);
        await first;
        await request(app.url).post('/charges?delay=200').set('Idempotency-Key', key).send({}).expect(201);
        await request(app.url)
          .post('/charges?delay=200')
          .set('Idempotency-Key', key)
          .send({ x: 1 })
          .expect(422);
        await request(app.url).post('/status/500').set('Idempotency-Key', newKey()).send({}).expect(500);
        expect(events).toEqual([
          'miss',
          'conflict',
          'complete:201',
          'hit',
          'mismatch',
          'miss',
          'release:not-cacheable',
        ]);
      });

      test('a hook that throws does not change the answer', async () => {
        const app = await make({
          hooks: {
            onMiss: () => {
              throw new Error('metrics down');
            },
          },
        });
        await request(app.url).post('/charges').set('Idempotency-Key', newKey()).send({}).expect(201);
      });
    });

    nestedRegistrationsSuite(harness);
    handlerFailuresSuite(harness);
    stepsSuite(harness);
  });
}
