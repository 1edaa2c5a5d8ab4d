import { getEventListeners } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { OncelyError, parseDuration } from '@oncely/core';
import { freePort } from '@oncely/testing';
import {
  type AttemptOutcome,
  IdempotentFetchError,
  type IdempotentFetchOptions,
  IdempotentFetchOptionsError,
  idempotentFetch,
  type RetryEvent,
} from '../src';
import { type Duration, resolveOptions } from '../src/options';

/** A fetch that answers `statuses` in turn (the last one repeated) and keeps each request it got. */
function scriptedFetch(statuses: number[], headers: Record<string, string> = {}) {
  const requests: Request[] = [];
  const bodies: Buffer[] = [];
  return {
    requests,
    bodies,
    fetch: async (request: Request) => {
      requests.push(request);
      bodies.push(Buffer.from(await request.arrayBuffer()));
      const status = statuses[Math.min(requests.length, statuses.length) - 1] ?? 200;
      return new Response(status === 204 ? null : JSON.stringify({ n: requests.length }), {
        status,
        headers,
      });
    },
  };
}

const statusOf = (outcome: AttemptOutcome) => (outcome.kind === 'response' ? outcome.status : outcome.kind);

describe('options are checked once, when idempotentFetch is called', () => {
  test('maxAttempts: 0 names the option and the rule', () => {
    expect(() => idempotentFetch({ maxAttempts: 0 })).toThrow(
      new TypeError('oncely: maxAttempts must be an integer ≥ 1; got 0'),
    );
    try {
      idempotentFetch({ maxAttempts: 0 });
    } catch (error) {
      expect(error).toBeInstanceOf(IdempotentFetchOptionsError);
      expect(error).toBeInstanceOf(TypeError);
      expect(error).toBeInstanceOf(OncelyError);
      expect((error as IdempotentFetchOptionsError).option).toBe('maxAttempts');
    }
  });

  test.each<[string, Record<string, unknown>, RegExp]>([
    ['maxAttempts', { maxAttempts: 1.5 }, /maxAttempts must be an integer ≥ 1; got 1\.5/],
    ['timeout', { timeout: 0 }, /timeout must be > 0 \(Infinity for no timeout\); got 0/],
    [
      'timeout',
      { timeout: -1 },
      /timeout must be a duration from 0 to 2147483647 ms \(24\.8 days, the longest a timer waits\): milliseconds or a string with a unit such as '5s', or Infinity for no limit; got -1/,
    ],
    ['timeout', { timeout: 3e9 }, /timeout must be a duration from 0 to 2147483647 ms.*got 3000000000/],
    ['deadline', { deadline: 2 ** 31 }, /deadline must be a duration.*got 2147483648/],
    ['maxDelay', { maxDelay: 2 ** 31 }, /maxDelay must be a duration.*got 2147483648/],
    ['timeout', { timeout: '1 day' }, /timeout must be a duration.*got "1 day"/],
    ['deadline', { deadline: '25d' }, /deadline must be a duration from 0 to 2147483647 ms.*got "25d"/],
    ['deadline', { deadline: Number.NaN }, /deadline must be a duration.*got NaN/],
    [
      'baseDelay',
      { baseDelay: Infinity },
      /baseDelay must be a duration from 0 to 2147483647 ms \(24\.8 days, the longest a timer waits\): milliseconds or a string with a unit such as '5s'; got Infinity/,
    ],
    ['maxDelay', { baseDelay: 500, maxDelay: 100 }, /maxDelay must be ≥ baseDelay \(500\)/],
    ['maxRetryAfter', { maxRetryAfter: -5 }, /maxRetryAfter must be a duration/],
    [
      'retryOn',
      { retryOn: [200] },
      /retryOn must be an array of HTTP error statuses \(integers 400 to 599\); got \[200\]/,
    ],
    ['retryOn', { retryOn: 503 }, /retryOn must be an array/],
    ['methods', { methods: ['PO ST'] }, /methods must be an array of HTTP method names/],
    ['idempotentMethods', { idempotentMethods: 'GET' }, /idempotentMethods must be an array/],
    ['header', { header: 'Idempotency Key' }, /header must be a header name/],
    [
      'maxBodyBytes',
      { maxBodyBytes: -1 },
      /maxBodyBytes must be an integer ≥ 0 \(bytes\), or Infinity; got -1/,
    ],
    ['fetch', { fetch: 'https://example.com' }, /fetch must be a function/],
    ['onRetry', { onRetry: true }, /onRetry must be a function; got true/],
    ['random', { random: 0.5 }, /random must be a function/],
    ['retries', { retries: 3 }, /unknown option "retries"; the options are fetch, methods/],
  ])('%s (case %#)', (option, options, message) => {
    let thrown: unknown;
    try {
      idempotentFetch(options as IdempotentFetchOptions);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(IdempotentFetchOptionsError);
    expect((thrown as IdempotentFetchOptionsError).option).toBe(option);
    expect((thrown as Error).message).toMatch(message);
  });

  test('valid options, Infinity where allowed, and no options at all are accepted', () => {
    expect(typeof idempotentFetch()).toBe('function');
    expect(typeof idempotentFetch({ timeout: Infinity, deadline: Infinity, maxBodyBytes: Infinity })).toBe(
      'function',
    );
  });

  test('the function has fetch’s type', () => {
    const asFetch: typeof fetch = idempotentFetch();
    expect(typeof asFetch).toBe('function');
  });
});

describe('durations: the strings the server takes, read as the server reads them', () => {
  test('every string the Duration type takes is read, negatives excepted', () => {
    expect(resolveOptions({ baseDelay: '1e3ms', maxDelay: '.5h' })).toMatchObject({
      baseDelay: 1000,
      maxDelay: 1_800_000,
    });
    expect(resolveOptions({ baseDelay: '+5s', maxDelay: '0x10s' })).toMatchObject({
      baseDelay: 5000,
      maxDelay: 16_000,
    });
    expect(() => resolveOptions({ baseDelay: '-5s' })).toThrow(IdempotentFetchOptionsError);
  });

  // The client has no dependencies, so it carries its own copy of the server's syntax: this keeps them one.
  const samples = [
    '250ms',
    '5s',
    '1.5m',
    '1.5 m',
    ' 30s ',
    '2h',
    '1d',
    '0s',
    '0.0004s',
    '10',
    '5S',
    '5 sec',
    '1 day',
    '-1s',
    '1e3ms',
    '.5s',
    '5s5s',
    '',
    ' ',
    'Infinity',
  ];
  test.each(samples.map((sample) => [sample]))('%j', (sample) => {
    let server: number | undefined;
    try {
      server = parseDuration(sample);
    } catch {
      server = undefined;
    }
    let client: number | undefined;
    try {
      client = resolveOptions({ baseDelay: sample as Duration, maxDelay: '1d' }).baseDelay;
    } catch (error) {
      expect(error).toBeInstanceOf(IdempotentFetchOptionsError);
      client = undefined;
    }
    expect(client).toBe(server);
  });
});

describe('retry rules', () => {
  test.each([400, 401, 403, 404, 410, 422, 500, 501])(
    '%i is returned at once, never retried',
    async (status) => {
      const { requests, fetch } = scriptedFetch([status, 201]);
      const res = await idempotentFetch({ fetch })('http://api.test/charges', { method: 'POST' });
      expect(res.status).toBe(status);
      expect(requests).toHaveLength(1);
    },
  );

  test.each([409, 425, 429, 502, 503, 504])('%i is retried, with the same key', async (status) => {
    const { requests, fetch } = scriptedFetch([status, 201]);
    const res = await idempotentFetch({ fetch, baseDelay: 1 })('http://api.test/charges', { method: 'POST' });
    expect(res.status).toBe(201);
    expect(requests).toHaveLength(2);
    expect(requests[1]?.headers.get('idempotency-key')).toBe(requests[0]?.headers.get('idempotency-key'));
  });

  test('a replayed answer (Idempotent-Replayed: true) is returned even with a retried status: it is final', async () => {
    const { requests, fetch } = scriptedFetch([409, 201], { 'idempotent-replayed': 'true' });
    const res = await idempotentFetch({ fetch, baseDelay: 1 })('http://api.test/charges', { method: 'POST' });
    expect(res.status).toBe(409);
    expect(requests).toHaveLength(1);
  });

  test('retryOn replaces the retried statuses', async () => {
    const { requests, fetch } = scriptedFetch([500, 503, 201]);
    const res = await idempotentFetch({ fetch, baseDelay: 1, retryOn: [500] })('http://api.test/x', {
      method: 'PUT',
    });
    expect(res.status).toBe(503);
    expect(requests).toHaveLength(2);
  });

  test('backoff doubles from baseDelay up to maxDelay; full jitter scales it by random()', async () => {
    for (const [random, expected] of [
      [() => 1, [8, 16, 32, 40, 40]],
      [() => 0.5, [4, 8, 16, 20, 20]],
      [() => 0, [0, 0, 0, 0, 0]],
    ] as const) {
      const delays: number[] = [];
      const { fetch } = scriptedFetch([503]);
      const client = idempotentFetch({
        fetch,
        random,
        baseDelay: 8,
        maxDelay: 40,
        maxAttempts: 6,
        onRetry: (e) => void delays.push(e.delayMs),
      });
      await expect(client('http://api.test/x', { method: 'POST' })).rejects.toThrow(IdempotentFetchError);
      expect(delays).toEqual(expected);
    }
  });

  test('durations may be strings with a unit, as the server takes them', async () => {
    const delays: number[] = [];
    const { fetch } = scriptedFetch([503]);
    const client = idempotentFetch({
      fetch,
      random: () => 1,
      baseDelay: '8ms',
      maxDelay: '0.04s',
      maxAttempts: 6,
      timeout: '10s',
      deadline: '1 m',
      maxRetryAfter: '30s',
      onRetry: (e) => void delays.push(e.delayMs),
    });
    await expect(client('http://api.test/x', { method: 'POST' })).rejects.toThrow(IdempotentFetchError);
    expect(delays).toEqual([8, 16, 32, 40, 40]);
  });

  test('Retry-After beats a shorter backoff; an invalid one is ignored', async () => {
    const delays: number[] = [];
    const onRetry = (e: RetryEvent) => void delays.push(e.delayMs);
    await idempotentFetch({
      fetch: scriptedFetch([429, 201], { 'retry-after': '0' }).fetch,
      random: () => 1,
      baseDelay: 30,
      onRetry,
    })('http://api.test/x', { method: 'POST' });
    await idempotentFetch({
      fetch: scriptedFetch([429, 201], { 'retry-after': 'soon' }).fetch,
      random: () => 1,
      baseDelay: 30,
      onRetry,
    })('http://api.test/x', { method: 'POST' });
    const past = new Date(Date.now() - 60_000).toUTCString();
    await idempotentFetch({
      fetch: scriptedFetch([429, 201], { 'retry-after': past }).fetch,
      random: () => 0,
      onRetry,
    })('http://api.test/x', { method: 'POST' });
    expect(delays).toEqual([30, 30, 0]);
  });

  test('an attempt without response headers within timeout is abandoned and retried', async () => {
    const seen: AbortSignal[] = [];
    // Never answers; rejects when its request is aborted, as fetch does.
    const hanging = (request: Request) =>
      new Promise<Response>((_resolve, reject) => {
        seen.push(request.signal);
        request.signal.addEventListener('abort', () => reject(request.signal.reason));
      });
    const error = await idempotentFetch({ fetch: hanging, timeout: 30, maxAttempts: 3, baseDelay: 1 })(
      'http://api.test/x',
      { method: 'POST' },
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(IdempotentFetchError);
    expect(error).toBeInstanceOf(OncelyError);
    const failure = error as IdempotentFetchError;
    expect(failure.attempts.map(statusOf)).toEqual(['timeout', 'timeout', 'timeout']);
    expect(failure.message).toMatch(/1: timeout after \d+ ms; 2: timeout/);
    expect(seen.every((s) => s.aborted && (s.reason as DOMException).name === 'TimeoutError')).toBe(true);
  });

  test('a refused connection is retried until maxAttempts; the error has each network error and the cause', async () => {
    const port = await freePort();
    const error = await idempotentFetch({ maxAttempts: 3, baseDelay: 1 })(`http://127.0.0.1:${port}/x`, {
      method: 'POST',
      body: '{}',
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(IdempotentFetchError);
    const failure = error as IdempotentFetchError;
    expect(failure.reason).toBe('max-attempts');
    expect(failure.attempts.map(statusOf)).toEqual(['network-error', 'network-error', 'network-error']);
    expect((failure.cause as Error).name).toBe('TypeError'); // fetch's network error
    expect(failure.message).toContain('ECONNREFUSED');
    expect(failure.response).toBeUndefined();
  });

  test('an exception thrown by onRetry rejects the call, and no further attempt is made', async () => {
    const { requests, fetch } = scriptedFetch([503, 201]);
    const oops = new Error('logging failed');
    const client = idempotentFetch({
      fetch,
      onRetry: () => {
        throw oops;
      },
    });
    await expect(client('http://api.test/x', { method: 'POST' })).rejects.toBe(oops);
    expect(requests).toHaveLength(1);
  });

  test('maxAttempts: 1 never retries; a retryable status then rejects with the response attached', async () => {
    const { requests, fetch } = scriptedFetch([503, 201]);
    const error = await idempotentFetch({ fetch, maxAttempts: 1 })('http://api.test/x', {
      method: 'POST',
    }).catch((e: unknown) => e);
    expect((error as IdempotentFetchError).reason).toBe('max-attempts');
    expect((error as IdempotentFetchError).response?.status).toBe(503);
    expect(requests).toHaveLength(1);
  });
});

describe('keys', () => {
  test('POST, PUT and patch get a UUID v4 key; GET, HEAD, DELETE get none; the header option renames it', async () => {
    const { requests, fetch } = scriptedFetch([200]);
    const client = idempotentFetch({ fetch, header: 'X-Request-Key' });
    for (const method of ['POST', 'PUT', 'patch', 'GET', 'HEAD', 'DELETE'])
      await client('http://api.test/x', { method });
    const keys = requests.map((r) => r.headers.get('x-request-key'));
    for (const key of keys.slice(0, 3))
      expect(key).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(new Set(keys.slice(0, 3)).size).toBe(3);
    expect(keys.slice(3)).toEqual([null, null, null]);
    expect(requests.every((r) => r.headers.get('idempotency-key') === null)).toBe(true);
  });

  test('without crypto.randomUUID (a browser page over http), keys are still UUID v4', async () => {
    // randomUUID lives on Crypto.prototype: an own property shadows it.
    Object.defineProperty(globalThis.crypto, 'randomUUID', { value: undefined, configurable: true });
    try {
      const { requests, fetch } = scriptedFetch([200]);
      await idempotentFetch({ fetch })('http://api.test/x', { method: 'POST' });
      expect(requests[0]?.headers.get('idempotency-key')).toMatch(
        /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
      );
    } finally {
      Reflect.deleteProperty(globalThis.crypto, 'randomUUID');
    }
    expect(typeof globalThis.crypto.randomUUID).toBe('function');
  });

  test('a bad per-call key, or one that contradicts the header, is refused before sending', async () => {
    const { requests, fetch } = scriptedFetch([200]);
    const client = idempotentFetch({ fetch });
    await expect(client('http://api.test/x', { method: 'POST', key: 'has space' })).rejects.toThrow(
      /oncely: key must be 1 to 255 visible ASCII characters/,
    );
    await expect(client('http://api.test/x', { method: 'POST', key: 'k'.repeat(256) })).rejects.toThrow(
      TypeError,
    );
    await expect(
      client('http://api.test/x', { method: 'POST', key: 'a', headers: { 'Idempotency-Key': 'b' } }),
    ).rejects.toThrow(/has an Idempotency-Key header \("b"\) and a different key option \("a"\)/);
    const refused = await client('http://api.test/x', { method: 'POST', key: 'has space' }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(OncelyError);
    expect((refused as IdempotentFetchOptionsError).option).toBe('key');
    expect(requests).toHaveLength(0);
  });

  test("a keyed request with mode 'no-cors' is refused before sending (browsers would drop the key); a GET without one is sent", async () => {
    const { requests, fetch } = scriptedFetch([200]);
    const client = idempotentFetch({ fetch });
    await expect(client('http://api.test/x', { method: 'POST', mode: 'no-cors' })).rejects.toThrow(
      /mode 'no-cors' cannot carry an Idempotency-Key/,
    );
    await expect(client('http://api.test/x', { method: 'GET', mode: 'no-cors', key: 'k-1' })).rejects.toThrow(
      TypeError,
    );
    expect(requests).toHaveLength(0);
    expect((await client('http://api.test/x', { mode: 'no-cors' })).status).toBe(200);
    expect(requests).toHaveLength(1);
  });

  test('a per-call key on a GET makes it a keyed request', async () => {
    const { requests, fetch } = scriptedFetch([200]);
    await idempotentFetch({ fetch })('http://api.test/x', { key: 'report-7' });
    expect(requests[0]?.headers.get('idempotency-key')).toBe('report-7');
  });
});

describe('bodies are sent again byte for byte', () => {
  test.each<[string, () => BodyInit]>([
    ['a string', () => JSON.stringify({ amount: 5 })],
    ['a Uint8Array', () => new Uint8Array([1, 2, 3, 250])],
    ['an ArrayBuffer', () => new Uint8Array([9, 8, 7]).buffer],
    ['URLSearchParams', () => new URLSearchParams({ a: '1', b: 'two' })],
    ['a Blob', () => new Blob(['blob body'], { type: 'text/plain' })],
    [
      'FormData (one multipart boundary for every attempt)',
      () => {
        const form = new FormData();
        form.append('amount', '5');
        form.append('file', new Blob(['abc']), 'a.txt');
        return form;
      },
    ],
  ])('%s', async (_label, body) => {
    const { bodies, requests, fetch } = scriptedFetch([503, 503, 201]);
    const res = await idempotentFetch({ fetch, baseDelay: 1 })('http://api.test/x', {
      method: 'POST',
      body: body(),
    });
    expect(res.status).toBe(201);
    expect(bodies).toHaveLength(3);
    expect((bodies[0] ?? Buffer.alloc(0)).length).toBeGreaterThan(0);
    expect(bodies.every((b) => b.equals(bodies[0] ?? Buffer.alloc(0)))).toBe(true);
    const types = requests.map((r) => r.headers.get('content-type'));
    expect(types.every((t) => t === types[0])).toBe(true);
  });

  test('the body of a Request passed as input', async () => {
    const { bodies, requests, fetch } = scriptedFetch([503, 201]);
    const input = new Request('http://api.test/x', {
      method: 'POST',
      body: 'from a Request',
      headers: { 'x-trace': '1' },
    });
    await idempotentFetch({ fetch, baseDelay: 1 })(input);
    expect(bodies.map(String)).toEqual(['from a Request', 'from a Request']);
    expect(requests.map((r) => r.headers.get('x-trace'))).toEqual(['1', '1']);
  });
});

test('a stream of something other than bytes is refused clearly, nothing sent', async () => {
  const { requests, fetch } = scriptedFetch([201]);
  const stream = new ReadableStream({
    start(c) {
      c.enqueue('text, not bytes');
      c.close();
    },
  });
  await expect(
    idempotentFetch({ fetch })('http://api.test/x', {
      method: 'POST',
      body: stream as ReadableStream<Uint8Array>,
    }),
  ).rejects.toThrow(/a request body stream must produce Uint8Array chunks \(as fetch requires\); got string/);
  expect(requests).toHaveLength(0);
});

describe('aborts', () => {
  test('an abort while a stream body is being read rejects at once, nothing sent', async () => {
    const { requests, fetch } = scriptedFetch([201]);
    const controller = new AbortController();
    // A stream that produces one chunk, then nothing.
    let sentFirst = false;
    const stream = new ReadableStream<Uint8Array>({
      pull(c) {
        if (!sentFirst) {
          sentFirst = true;
          c.enqueue(new Uint8Array([1]));
        }
        return new Promise(() => {});
      },
    });
    setTimeout(() => controller.abort(), 30);
    const error = await idempotentFetch({ fetch })('http://api.test/x', {
      method: 'POST',
      body: stream,
      signal: controller.signal,
    }).catch((e: unknown) => e);
    expect((error as Error).name).toBe('AbortError');
    expect(requests).toHaveLength(0);
  });
});

describe('a signal shared by many calls', () => {
  test('keeps no listener of a call whose body was read, cancelled or absent', async () => {
    const { fetch } = scriptedFetch([201]);
    const shared = new AbortController();
    const client = idempotentFetch({ fetch });
    for (let i = 0; i < 30; i++) {
      const res = await client('http://api.test/x', { method: 'POST', signal: shared.signal });
      if (i % 3 === 0) expect(await res.json()).toEqual({ n: expect.any(Number) });
      else if (i % 3 === 1) await res.body?.cancel();
      else await res.arrayBuffer();
    }
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(0);
    // A response with no body (204) lets go at once.
    const { fetch: noBody } = scriptedFetch([204]);
    const empty = await idempotentFetch({ fetch: noBody })('http://api.test/x', {
      method: 'POST',
      signal: shared.signal,
    });
    expect(empty.status).toBe(204);
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(0);
  });

  test('an abort while the body is read still fails the read; status, headers and url are the response’s', async () => {
    const shared = new AbortController();
    const fetch = async (request: Request) => {
      // Headers at once, then a body that ends only when the request is aborted, as a slow download does.
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(new Uint8Array([1, 2]));
          request.signal.addEventListener('abort', () => controller.error(request.signal.reason));
        },
      });
      const answer = new Response(body, { status: 201, statusText: 'Made', headers: { 'x-id': '7' } });
      Object.defineProperty(answer, 'url', { value: request.url });
      return answer;
    };
    const res = await idempotentFetch({ fetch })('http://api.test/slow', {
      method: 'POST',
      signal: shared.signal,
    });
    expect([res.status, res.statusText, res.headers.get('x-id'), res.url]).toEqual([
      201,
      'Made',
      '7',
      'http://api.test/slow',
    ]);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    expect((await reader.read()).value).toEqual(new Uint8Array([1, 2]));
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(1);
    shared.abort(new Error('user left'));
    await expect(reader.read()).rejects.toThrow('user left');
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(0);
  });
});

describe('in Node’s fetch, a timeout aborts the attempt even after a garbage collection', () => {
  let server: Server;
  let url: string;
  beforeAll(async () => {
    server = createServer((_req, res) => void setTimeout(() => res.end('late'), 600));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  // undici links the signal of the Request it sends to ours through a weak reference; a collected link means an
  // abort that never arrives (seen as a flaky test before the client held its Request).
  test('the timeout fires and the attempt is abandoned', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const client = idempotentFetch({ timeout: 150, maxAttempts: 1 });
    const call = client(url, { method: 'POST', body: 'x' }).catch((e: unknown) => e);
    for (let i = 0; i < 5; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      gc();
    }
    const error = await call;
    expect(error).toBeInstanceOf(IdempotentFetchError);
    expect((error as IdempotentFetchError).attempts.map(statusOf)).toEqual(['timeout']);
  });
});

test('the sources use web-standard APIs only (they run in browsers unchanged)', () => {
  const dir = join(__dirname, '..', 'src');
  for (const file of readdirSync(dir)) {
    const source = readFileSync(join(dir, file), 'utf8');
    expect({ file, nodeImports: source.match(/from ['"]node:|require\(/g) }).toEqual({
      file,
      nodeImports: null,
    });
    expect({
      file,
      nodeGlobals: source.match(/\b(Buffer|process|setImmediate|__dirname|global)\b\./g),
    }).toEqual({
      file,
      nodeGlobals: null,
    });
  }
});
