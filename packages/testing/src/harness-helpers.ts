import { randomUUID } from 'node:crypto';
import { request as httpRequest, type Server } from 'node:http';
import { connect, constants as http2Constants } from 'node:http2';
import type { AddressInfo } from 'node:net';
import {
  type IdempotencyHooks,
  type IdempotencyOptions,
  type IdempotencyStore,
  MemoryStore,
} from '@oncely/core';
import type request from 'supertest';
import { sleep, waitUntil } from './consumers';
import type { TestApp, TestAppOptions, TestRequest } from './suite-types';

/** A supertest parser that keeps any body as its bytes: `.buffer(true).parse(binaryParser)`. */
export function binaryParser(
  res: request.Response,
  callback: (err: Error | null, body: Buffer) => void,
): void {
  const chunks: Buffer[] = [];
  res.on('data', (chunk: Buffer) => chunks.push(chunk));
  res.on('end', () => callback(null, Buffer.concat(chunks)));
}

/** Counts handler runs per route: `hit(route)` in a handler, `count(route)` for `TestApp.count`. */
export function routeCounts(): { hit(route: string): number; count(route: string): number } {
  const counts = new Map<string, number>();
  return {
    hit(route) {
      const n = (counts.get(route) ?? 0) + 1;
      counts.set(route, n);
      return n;
    },
    count: (route) => counts.get(route) ?? 0,
  };
}

/**
 * A store (a MemoryStore unless one is given) whose `acquire` waits until `release()` is called: the request stays
 * at "asking the store" for as long as a test needs (to close the client, or answer the request from elsewhere,
 * meanwhile). `asked` resolves once `acquire` has been called.
 */
export function gatedStore<Inner extends IdempotencyStore = MemoryStore>(inner?: Inner) {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  let onAsked!: () => void;
  const asked = new Promise<void>((resolve) => {
    onAsked = resolve;
  });
  const memory = (inner ?? new MemoryStore()) as Inner;
  const slow: IdempotencyStore = {
    acquire: async (...args: Parameters<IdempotencyStore['acquire']>) => {
      onAsked();
      await gate;
      return memory.acquire(...args);
    },
    complete: memory.complete.bind(memory),
    release: memory.release.bind(memory),
    renew: memory.renew.bind(memory),
  };
  return { memory, slow, release, asked };
}

/**
 * A POST of `{}` over HTTP/2 to `origin` + `path` with these headers, on a session of its own. With `cancelWhen`
 * the client cancels its stream once that promise resolves (RST_STREAM) and the answer is `undefined`; otherwise
 * the status, the body and whether it was a replay (`Idempotent-Replayed: true`).
 */
export async function http2Post(
  origin: string,
  path: string,
  headers: Record<string, string>,
  options: { cancelWhen?: Promise<unknown> } = {},
): Promise<{ status: number; body: string; replayed: boolean } | undefined> {
  const session = connect(origin);
  session.on('error', () => {});
  try {
    return await new Promise((resolve, reject) => {
      const stream = session.request({
        ':method': 'POST',
        ':path': path,
        'content-type': 'application/json',
        ...headers,
      });
      let status = 0;
      let replayed = false;
      let body = '';
      stream.on('response', (answer) => {
        status = Number(answer[':status']);
        replayed = answer['idempotent-replayed'] === 'true';
      });
      stream.setEncoding('utf8');
      stream.on('data', (chunk: string) => {
        body += chunk;
      });
      stream.on('end', () => resolve({ status, body, replayed }));
      stream.on('error', (error) => (options.cancelWhen === undefined ? reject(error) : resolve(undefined)));
      stream.end('{}');
      void options.cancelWhen?.then(() => {
        stream.close(http2Constants.NGHTTP2_CANCEL);
        resolve(undefined);
      });
    });
  } finally {
    session.destroy();
  }
}

/**
 * A POST of `{}` over HTTP/1.1 to `url` + `path` with these headers. With `leaveWhen` the client closes its
 * connection once that promise resolves, without waiting for an answer, and the answer is `undefined`; otherwise
 * the status, the body and whether it was a replay (`Idempotent-Replayed: true`).
 */
export function http1Post(
  url: string,
  path: string,
  headers: Record<string, string>,
  options: { leaveWhen?: Promise<unknown> } = {},
): Promise<{ status: number; body: string; replayed: boolean } | undefined> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: hostname,
        port,
        method: 'POST',
        path,
        headers: { 'content-type': 'application/json', ...headers },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            body,
            replayed: res.headers['idempotent-replayed'] === 'true',
          }),
        );
      },
    );
    req.on('error', (error) => (options.leaveWhen === undefined ? reject(error) : resolve(undefined)));
    req.end('{}');
    void options.leaveWhen?.then(() => {
      req.destroy();
      resolve(undefined);
    });
  });
}

/** What `expectLeavingClientReleased` gives the app it starts. */
export interface LeavingClientOptions {
  /** Acquires only when the test lets it: the request stays at "asking the store" while its client leaves. */
  store: IdempotencyStore;
  lockTimeout: number;
  hooks: IdempotencyHooks;
}

/** The app under test, serving one covered route that answers 201 and counts its runs. */
export interface LeavingClientApp {
  /**
   * Sends a request with `key` and gives up on it (closes the connection, cancels the stream, aborts the signal)
   * once `asked` resolves, that is, while the store is asked; resolves once the client has left. Where the caller
   * still gets an answer (a fetch handler called in-process), `answered` is its status: 499 is expected.
   */
  // biome-ignore lint/suspicious/noConfusingVoidType: a client that leaves over a socket learns nothing more
  leave(key: string, asked: Promise<void>): Promise<void | { answered: Promise<number> }>;
  /** Sends the client's retry and gives its status and whether it was a replay. */
  retry(key: string): Promise<{ status: number; replayed: boolean } | undefined>;
  runs(): number;
  close?(): Promise<void>;
}

/**
 * "A client that leaves while the store is asked", on whatever transport `start` serves and on `store` (a
 * MemoryStore unless given): once the store answers, the handler does not run (nobody would get its answer, and it
 * would be stored for the retry to replay), the key is released with the reason `'client-gone'` (not left leased
 * for `lockTimeout`, a minute here, which would answer the retry 409), and the client's retry runs the handler.
 */
export async function expectLeavingClientReleased(
  start: (options: LeavingClientOptions) => Promise<LeavingClientApp>,
  store?: IdempotencyStore,
): Promise<void> {
  const { memory, slow, release, asked } = gatedStore(store);
  const reasons: string[] = [];
  const app = await start({
    store: slow,
    lockTimeout: 60_000,
    hooks: {
      onRelease: (event) => {
        reasons.push(event.reason);
      },
    },
  });
  const key = `left-${randomUUID()}`;
  try {
    const left = await app.leave(key, asked);
    // Let the server see the client leave before the store answers: over a socket that takes a few turns of the
    // event loop (end of stream, then the response destroyed). Ten timers in a row are ten turns, each with its
    // I/O phase, however late a busy machine fires them; one longer timer could fire first on a starved process.
    for (let turn = 0; turn < 10; turn++) await sleep(5);
    release();
    if (left !== undefined) expect(await left.answered).toBe(499);
    // A mistake shows as a handler run or no release at all, so wait for either, then assert which it was.
    await waitUntil(() => reasons.length > 0 || app.runs() > 0, 'a release or a run', 2_000).catch(() => {});
    await sleep(50);
    expect(app.runs()).toBe(0);
    expect(reasons).toEqual(['client-gone']);
    if (memory.get !== undefined) expect(await memory.get(key)).toBeUndefined();
    expect(await app.retry(key)).toMatchObject({ status: 201, replayed: false });
    expect(app.runs()).toBe(1);
  } finally {
    release();
    await app.close?.();
  }
}

/**
 * The `LeavingClientApp` of a fetch handler called in-process (`@oncely/web`'s, Hono's `app.fetch`): a client that
 * leaves is one whose request's signal aborts, once the store is asked.
 */
export function fetchHandlerClient(
  handle: (request: Request) => Response | Promise<Response>,
  url: string,
  runs: () => number,
): LeavingClientApp {
  const send = (key: string, signal?: AbortSignal) =>
    Promise.resolve(
      handle(
        new Request(url, {
          method: 'POST',
          body: '{}',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          ...(signal === undefined ? {} : { signal }),
        }),
      ),
    );
  return {
    leave: async (key, asked) => {
      const client = new AbortController();
      const answered = send(key, client.signal).then((answer) => answer.status);
      await asked;
      client.abort();
      return { answered };
    },
    retry: async (key) => {
      const answer = await send(key);
      return { status: answer.status, replayed: answer.headers.get('idempotent-replayed') === 'true' };
    },
    runs,
  };
}

/** Listens on a free port of 127.0.0.1 and gives the suite its `TestApp`; `close` drops open connections. */
export async function serveTestApp(server: Server, count: (route: string) => number): Promise<TestApp> {
  server.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    count,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * The suite's options for an adapter whose `scope` and `fingerprint` get another request type (a web `Request`,
 * Hono's `Context`): the suite's callbacks read Node-style headers, so they get `view(request)`.
 */
export function viewOptions<Req>(
  options: TestAppOptions,
  view: (request: Req) => TestRequest,
): IdempotencyOptions<Req> {
  const { scope, fingerprint, ...rest } = options;
  const adapted: IdempotencyOptions<Req> = { ...rest };
  if (scope !== undefined) adapted.scope = scope === false ? false : (request) => scope(view(request));
  if (fingerprint !== undefined)
    adapted.fingerprint = fingerprint === false ? false : (request) => fingerprint(view(request));
  return adapted;
}
