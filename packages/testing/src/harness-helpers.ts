import type { Server } from 'node:http';
import { connect, constants as http2Constants } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { type IdempotencyOptions, MemoryStore } from '@oncely/core';
import type { TestApp, TestAppOptions, TestRequest } from './http-suite';

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
 * A MemoryStore whose `acquire` waits until `release()` is called: the request stays at "asking the store" for as
 * long as a test needs (to close the client, or answer the request from elsewhere, meanwhile).
 */
export function gatedStore() {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const memory = new MemoryStore();
  const slow = {
    acquire: async (...args: Parameters<MemoryStore['acquire']>) => {
      await gate;
      return memory.acquire(...args);
    },
    complete: memory.complete.bind(memory),
    release: memory.release.bind(memory),
    renew: memory.renew.bind(memory),
  };
  return { memory, slow, release };
}

/**
 * A POST of `{}` over HTTP/2 to `origin` + `path` with these headers, on a session of its own. With `cancelAfterMs`
 * the client cancels its stream then (RST_STREAM) and the answer is `undefined`; otherwise the status and body.
 */
export async function http2Post(
  origin: string,
  path: string,
  headers: Record<string, string>,
  options: { cancelAfterMs?: number } = {},
): Promise<{ status: number; body: string } | undefined> {
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
      let body = '';
      stream.on('response', (answer) => {
        status = Number(answer[':status']);
      });
      stream.setEncoding('utf8');
      stream.on('data', (chunk: string) => {
        body += chunk;
      });
      stream.on('end', () => resolve({ status, body }));
      stream.on('error', (error) =>
        options.cancelAfterMs === undefined ? reject(error) : resolve(undefined),
      );
      stream.end('{}');
      if (options.cancelAfterMs !== undefined) {
        setTimeout(() => {
          stream.close(http2Constants.NGHTTP2_CANCEL);
          resolve(undefined);
        }, options.cancelAfterMs);
      }
    });
  } finally {
    session.destroy();
  }
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
