import { randomUUID } from 'node:crypto';
import { type IdempotencyStore, OncelyError } from '@oncely/core';
import { IdempotentFetchError, type IdempotentFetchOptions, idempotentFetch, type RetryEvent } from '../src';
import { droppingProxy } from './proxy';
import type { ServerKind, TestServer } from './servers';

/** What reached the wire: each attempt's key header, method and send time. */
export function recordingFetch(): {
  sent: { key: string | null; method: string; at: number }[];
  fetch: (request: Request) => Promise<Response>;
} {
  const sent: { key: string | null; method: string; at: number }[] = [];
  return {
    sent,
    fetch: (request) => {
      sent.push({ key: request.headers.get('idempotency-key'), method: request.method, at: Date.now() });
      return fetch(request);
    },
  };
}

/** A stream of `chunks` chunks of 1000 bytes; `pulled()` counts the chunks it produced. */
export function byteStream(chunks: number): {
  stream: ReadableStream<Uint8Array>;
  bytes: Buffer;
  pulled(): number;
} {
  const bytes = Buffer.alloc(chunks * 1000);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 13) % 256;
  let produced = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (produced === chunks) return controller.close();
      controller.enqueue(new Uint8Array(bytes.subarray(produced * 1000, ++produced * 1000)));
    },
  });
  return { stream, bytes, pulled: () => produced };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const json = (value: unknown): RequestInit => ({
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify(value),
});

/** Fast retries for tests: small backoff, `Retry-After` capped low, a delay of 0 when jitter draws 0. */
const quick: IdempotentFetchOptions = { baseDelay: 20, maxDelay: 50, maxRetryAfter: 100 };

/** The client against a real oncely server of `kind` on `store()`, over real sockets. */
export function clientSuite(kind: ServerKind, storeName: string, store: () => IdempotencyStore): void {
  describe(`@oncely/client against ${kind.name} on ${storeName}`, () => {
    const closers: (() => Promise<void>)[] = [];
    const start = async (): Promise<TestServer> => {
      const server = await kind.start(store());
      closers.push(server.close);
      return server;
    };
    afterEach(async () => {
      await Promise.all(closers.splice(0).map((close) => close()));
    });

    test('a handler slower than the timeout: the same key through timeouts and 409s to the replay; one execution', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const retries: RetryEvent[] = [];
      const client = idempotentFetch({
        ...quick,
        fetch,
        timeout: 250,
        maxAttempts: 100,
        deadline: 15_000,
        onRetry: (event) => retries.push(event),
      });
      // The handler outlasts several timeouts, so at least one retry meets it in progress (409) even when a
      // loaded machine answers a 409 slower than the timeout now and then.
      const res = await client(`${app.url}/charges?delay=2000`, json({ amount: 42 }));
      const key = sent[0]?.key;
      expect(key).toMatch(UUID);
      // One object, so that a failure shows the whole story.
      expect({
        status: res.status,
        replayed: res.headers.get('idempotent-replayed'),
        chargeId: res.headers.get('x-charge-id'),
        body: await res.json(),
        executions: app.count('charges'),
        attempts: retries.map((r) => (r.previous.kind === 'response' ? r.previous.status : r.previous.kind)),
      }).toEqual({
        status: 201,
        replayed: 'true',
        chargeId: '1',
        body: { id: 1, amount: 42, key },
        executions: 1,
        attempts: expect.arrayContaining(['timeout', 409]),
      });
      expect(sent.length).toBeGreaterThanOrEqual(3);
      expect(sent.every((attempt) => attempt.key === key)).toBe(true);
      expect(retries[0]?.previous.kind).toBe('timeout');
      expect(retries.some((r) => r.previous.kind === 'response' && r.previous.status === 409)).toBe(true);
      expect(retries.map((r) => r.attempt)).toEqual(retries.map((_r, i) => i + 2));
      expect(retries.every((r) => r.key === key && r.method === 'POST')).toBe(true);
    });

    test('an answer lost on the way back (connection dropped after the handler ran): one execution, the replay', async () => {
      const app = await start();
      const proxy = await droppingProxy(app.url);
      closers.push(proxy.close);
      proxy.drops = 1;
      const retries: RetryEvent[] = [];
      const client = idempotentFetch({ ...quick, onRetry: (event) => retries.push(event) });
      const res = await client(`${proxy.url}/charges`, json({ amount: 7 }));
      expect(proxy.dropped).toBe(1);
      expect(retries).toHaveLength(1);
      expect(retries[0]?.previous.kind).toBe('network-error');
      expect(res.status).toBe(201);
      expect(res.headers.get('idempotent-replayed')).toBe('true');
      expect(await res.json()).toEqual({ id: 1, amount: 7, key: retries[0]?.key });
      expect(app.count('charges')).toBe(1);
    });

    test('422 (a key reused for a different body) is returned, not retried', async () => {
      const app = await start();
      const key = randomUUID();
      const { sent, fetch } = recordingFetch();
      const onRetry = jest.fn();
      const client = idempotentFetch({ ...quick, fetch, onRetry });
      expect((await client(`${app.url}/charges`, { ...json({ amount: 1 }), key })).status).toBe(201);
      const res = await client(`${app.url}/charges`, { ...json({ amount: 2 }), key });
      expect(res.status).toBe(422);
      expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect((await res.json()).type).toBe('https://oncely.dev/problems/key-reused');
      expect(sent).toHaveLength(2);
      expect(onRetry).not.toHaveBeenCalled();
      expect(app.count('charges')).toBe(1);
    });

    test('a handler’s own 409, stored: the retry gets its replay, which is returned, not retried; one execution', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const res = await idempotentFetch({ ...quick, fetch })(`${app.url}/taken`, json({}));
      expect(res.status).toBe(409);
      expect(res.headers.get('idempotent-replayed')).toBe('true');
      expect(await res.json()).toEqual({ n: 1, error: 'taken' });
      // The first 409 could be oncely's "in progress", so it is retried once; the replay says it was not.
      expect(sent).toHaveLength(2);
      expect(app.count('taken')).toBe(1);
    });

    test('400 (a malformed key the caller gave) is returned, not retried', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const client = idempotentFetch({ ...quick, fetch });
      const res = await client(`${app.url}/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'a b' },
        body: '{}',
      });
      expect(res.status).toBe(400);
      expect((await res.json()).type).toBe('https://oncely.dev/problems/key-invalid');
      expect(sent).toHaveLength(1);
      expect(app.count('charges')).toBe(0);
    });

    test('Retry-After in seconds is waited for', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const retries: RetryEvent[] = [];
      const client = idempotentFetch({ fetch, random: () => 0, onRetry: (event) => retries.push(event) });
      const res = await client(`${app.url}/flaky?times=1&retryAfter=1`, json({}));
      expect(res.status).toBe(201);
      expect(retries).toHaveLength(1);
      expect(retries[0]?.previous).toMatchObject({ kind: 'response', status: 503, retryAfterMs: 1000 });
      expect(retries[0]?.delayMs).toBe(1000);
      expect((sent[1]?.at ?? 0) - (sent[0]?.at ?? 0)).toBeGreaterThanOrEqual(990);
      expect(app.count('flaky')).toBe(2);
    });

    test('Retry-After as an HTTP date is waited for', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const retries: RetryEvent[] = [];
      const client = idempotentFetch({ fetch, random: () => 0, onRetry: (event) => retries.push(event) });
      const res = await client(`${app.url}/flaky?times=1&retryAfter=date%2B2`, json({}));
      expect(res.status).toBe(201);
      // The date has whole seconds: 2 s ahead, truncated, is between 1 and 2 s away.
      const delay = retries[0]?.delayMs ?? 0;
      expect(delay).toBeGreaterThan(900);
      expect(delay).toBeLessThanOrEqual(2000);
      expect((sent[1]?.at ?? 0) - (sent[0]?.at ?? 0)).toBeGreaterThanOrEqual(delay - 10);
      expect(app.count('flaky')).toBe(2);
    });

    test('a Retry-After beyond maxRetryAfter is cut to it', async () => {
      const app = await start();
      const retries: RetryEvent[] = [];
      const client = idempotentFetch({
        random: () => 0,
        maxRetryAfter: 150,
        onRetry: (e) => retries.push(e),
      });
      const res = await client(`${app.url}/flaky?times=1&retryAfter=3600`, json({}));
      expect(res.status).toBe(201);
      expect(retries[0]?.previous).toMatchObject({ status: 503, retryAfterMs: 3_600_000 });
      expect(retries[0]?.delayMs).toBe(150);
    });

    test('the deadline holds: no wait that would end after it', async () => {
      const app = await start();
      // 503, wait 2 s, 503: a second wait of 2 s would pass the deadline however fast the attempts are, and the
      // two attempts (and the first wait's overshoot) have 1.9 s between them to fit in before it.
      const client = idempotentFetch({ random: () => 0, deadline: 3900 });
      const startedAt = Date.now();
      const error = await client(`${app.url}/flaky?times=100&retryAfter=2`, json({})).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(IdempotentFetchError);
      const failure = error as IdempotentFetchError;
      expect(failure.reason).toBe('deadline');
      expect(failure.attempts.map((a) => (a.kind === 'response' ? a.status : a.kind))).toEqual([503, 503]);
      expect(failure.response?.status).toBe(503);
      expect(Date.now() - startedAt).toBeLessThan(5500);
      expect(app.count('flaky')).toBe(2);
    });

    test('the deadline cuts an attempt short', async () => {
      const app = await start();
      const client = idempotentFetch({ random: () => 0, deadline: 400, timeout: 10_000 });
      const startedAt = Date.now();
      const error = await client(`${app.url}/charges?delay=5000`, json({})).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(IdempotentFetchError);
      expect((error as IdempotentFetchError).reason).toBe('deadline');
      expect((error as IdempotentFetchError).attempts.map((a) => a.kind)).toEqual(['timeout']);
      expect(Date.now() - startedAt).toBeLessThan(3000);
    });

    test('maxAttempts holds; the error carries every attempt and the key', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const client = idempotentFetch({ ...quick, fetch, maxAttempts: 3 });
      const error = await client(`${app.url}/flaky?times=100&retryAfter=0`, json({})).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(IdempotentFetchError);
      const failure = error as IdempotentFetchError;
      expect(failure.reason).toBe('max-attempts');
      expect(failure.attempts).toHaveLength(3);
      expect(failure.attempts.every((a) => a.kind === 'response' && a.status === 503)).toBe(true);
      expect(failure.key).toBe(sent[0]?.key);
      expect(failure.message).toContain('after 3 attempts');
      expect(await failure.response?.json()).toEqual({ n: 3 });
      expect(app.count('flaky')).toBe(3);
    });

    test('an abort during an attempt rejects at once with the signal’s reason', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const controller = new AbortController();
      const reason = new Error('the user left');
      setTimeout(() => controller.abort(reason), 100);
      const startedAt = Date.now();
      const client = idempotentFetch({ fetch, timeout: 20_000 });
      await expect(
        client(`${app.url}/charges?delay=5000`, { ...json({}), signal: controller.signal }),
      ).rejects.toBe(reason);
      expect(Date.now() - startedAt).toBeLessThan(2000);
      expect(sent).toHaveLength(1);
    });

    test('an abort during a backoff wait rejects at once', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const controller = new AbortController();
      const client = idempotentFetch({
        fetch,
        maxRetryAfter: 30_000,
        onRetry: () => void setTimeout(() => controller.abort(), 50),
      });
      const startedAt = Date.now();
      const error = await client(`${app.url}/flaky?times=100&retryAfter=30`, {
        ...json({}),
        signal: controller.signal,
      }).catch((e: unknown) => e);
      expect((error as Error).name).toBe('AbortError');
      expect(Date.now() - startedAt).toBeLessThan(5000);
      expect(sent).toHaveLength(1);
    });

    test('an aborted signal: nothing is sent', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const reason = new Error('already gone');
      await expect(
        idempotentFetch({ fetch })(`${app.url}/charges`, { ...json({}), signal: AbortSignal.abort(reason) }),
      ).rejects.toBe(reason);
      expect(sent).toHaveLength(0);
      expect(app.count('charges')).toBe(0);
    });

    test('a stream body is read once and sent again, byte for byte, on each attempt', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const { stream, bytes, pulled } = byteStream(3);
      const client = idempotentFetch({ ...quick, fetch });
      const res = await client(`${app.url}/echo?times=1`, {
        method: 'POST',
        headers: { 'content-type': 'application/octet-stream' },
        body: stream,
      });
      expect(res.status).toBe(201);
      expect(Buffer.from(await res.arrayBuffer()).equals(bytes)).toBe(true);
      expect(pulled()).toBe(3);
      expect(app.bodies).toHaveLength(2);
      expect(app.bodies.every((body) => body.equals(bytes))).toBe(true);
      expect(sent).toHaveLength(2);
      expect(sent[1]?.key).toBe(sent[0]?.key);
    });

    test('a stream body over maxBodyBytes is refused before anything is sent', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const { stream, pulled } = byteStream(5);
      const client = idempotentFetch({ fetch, maxBodyBytes: 2500 });
      const error = await client(`${app.url}/echo`, {
        method: 'POST',
        headers: { 'content-type': 'application/octet-stream' },
        body: stream,
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect(error).toBeInstanceOf(OncelyError);
      expect((error as Error).message).toMatch(/larger than maxBodyBytes \(2500 bytes\).*nothing was sent/);
      expect(pulled()).toBeLessThan(5); // not read to its end: it stopped past the limit (streams read ahead a little)
      expect(sent).toHaveLength(0);
      expect(app.count('echo')).toBe(0);
    });

    test('a caller-given Idempotency-Key header is kept, on every attempt and across calls', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const key = `order-${randomUUID()}`;
      const client = idempotentFetch({ ...quick, fetch });
      const init = () => ({
        ...json({ amount: 3 }),
        headers: { 'content-type': 'application/json', 'Idempotency-Key': key },
      });
      const first = await client(`${app.url}/charges`, init());
      expect(await first.json()).toEqual({ id: 1, amount: 3, key });
      const again = await client(`${app.url}/charges`, init());
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(sent.map((s) => s.key)).toEqual([key, key]);
      expect(app.count('charges')).toBe(1);
    });

    test('a per-call key is sent on every attempt', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const key = `cart-${randomUUID()}`;
      const res = await idempotentFetch({ ...quick, fetch })(`${app.url}/flaky?times=1&retryAfter=0`, {
        ...json({}),
        key,
      });
      expect(res.status).toBe(201);
      expect(sent.map((s) => s.key)).toEqual([key, key]);
    });

    test('GET gets no key and is retried on a retryable status', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const res = await idempotentFetch({ ...quick, fetch })(`${app.url}/items?times=1`);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ n: 2, key: null });
      expect(sent.map((s) => [s.method, s.key])).toEqual([
        ['GET', null],
        ['GET', null],
      ]);
    });

    test('GET is retried after a dropped connection (and so may run twice: it has no key)', async () => {
      const app = await start();
      const proxy = await droppingProxy(app.url);
      closers.push(proxy.close);
      proxy.drops = 1;
      const res = await idempotentFetch(quick)(`${proxy.url}/items`);
      expect(res.status).toBe(200);
      expect(proxy.dropped).toBe(1);
      expect(app.count('items')).toBe(2);
    });

    test('a POST outside `methods` gets no key and is sent once: a 503 is returned, a lost answer rejects', async () => {
      const app = await start();
      const { sent, fetch } = recordingFetch();
      const client = idempotentFetch({ ...quick, fetch, methods: [] });
      const res = await client(`${app.url}/flaky?times=1`, json({}));
      expect(res.status).toBe(503);
      expect(sent).toEqual([expect.objectContaining({ key: null })]);

      const proxy = await droppingProxy(app.url);
      closers.push(proxy.close);
      proxy.drops = 1;
      const error = await client(`${proxy.url}/charges`, json({})).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(IdempotentFetchError);
      expect((error as IdempotentFetchError).reason).toBe('not-retryable');
      expect((error as IdempotentFetchError).attempts).toEqual([
        expect.objectContaining({ attempt: 1, kind: 'network-error' }),
      ]);
      expect(app.count('charges')).toBe(1);
    });
  });
}
