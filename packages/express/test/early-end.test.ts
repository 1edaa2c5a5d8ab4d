import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { type IdempotencyStore, MemoryStore } from '@oncely/core';
import { sleep } from '@oncely/testing';
import express from 'express';
import express4 from 'express4';
import request from 'supertest';
import { idempotency } from '../src';

// res.sendFile and res.download stream a file through `send`, which stops (and reports nothing to the app) when the
// client goes away: the response never ends, so only its connection's close can settle the key.
const dir = mkdtempSync(join(tmpdir(), 'oncely-early-end-'));
const file = join(dir, 'big.bin');
writeFileSync(file, Buffer.alloc(8 * 1024 * 1024, 7));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function countingRenewals(inner: IdempotencyStore): IdempotencyStore & { renewals: number } {
  const store = {
    renewals: 0,
    acquire: (...args: Parameters<IdempotencyStore['acquire']>) => inner.acquire(...args),
    complete: (...args: Parameters<IdempotencyStore['complete']>) => inner.complete(...args),
    release: (...args: Parameters<IdempotencyStore['release']>) => inner.release(...args),
    renew: (...args: Parameters<IdempotencyStore['renew']>) => {
      store.renewals++;
      return inner.renew(...args);
    },
  };
  return store;
}

/** POSTs with `key` and destroys the connection once some of the body arrived. */
function leaveMidway(url: string, path: string, key: string): Promise<number> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({
      host: hostname,
      port,
      path,
      method: 'POST',
      headers: { 'idempotency-key': key },
    });
    req.on('error', () => {});
    req.on('response', (res) => {
      let received = 0;
      res.on('error', () => {});
      res.on('data', (chunk: Buffer) => {
        received += chunk.byteLength;
        if (received >= 64 * 1024) {
          req.destroy();
          resolve(received);
        }
      });
      res.on('end', () => reject(new Error('the whole file arrived before the client could leave')));
    });
    req.end();
  });
}

describe.each([
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
])('%s: a client leaving res.sendFile / res.download midway', (_name, factory) => {
  let server: Server;
  let url: string;
  let runs: number;
  let store: ReturnType<typeof countingRenewals>;
  beforeEach(async () => {
    runs = 0;
    store = countingRenewals(new MemoryStore());
    const app = factory();
    // Renewed every 100 ms while the lease is held.
    app.use(idempotency({ store, lockTimeout: 300 }));
    app.post('/file', (_req, res) => {
      runs++;
      res.sendFile(file);
    });
    app.post('/download', (_req, res) => {
      runs++;
      res.download(file);
    });
    server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  test.each(['/file', '/download'])('%s: the retry gets a 410 at once, and renewals stop', async (path) => {
    const key = `key-${randomUUID()}`;
    await leaveMidway(url, path, key);
    await sleep(100);
    const retry = await request(url).post(path).set('Idempotency-Key', key);
    expect(retry.status).toBe(410);
    expect(retry.body.type).toBe('https://oncely.dev/problems/response-not-stored');
    expect(runs).toBe(1);
    const renewals = store.renewals;
    await sleep(400);
    expect(store.renewals).toBe(renewals);
  });
});

/** POSTs with `key` and destroys the connection as soon as `started()` says the handler runs. */
async function leaveOnceStarted(
  url: string,
  path: string,
  key: string,
  started: () => boolean,
): Promise<void> {
  const { hostname, port } = new URL(url);
  const req = httpRequest({
    host: hostname,
    port,
    path,
    method: 'POST',
    headers: { 'idempotency-key': key },
  });
  req.on('error', () => {});
  req.on('response', (res) => res.resume());
  req.end();
  while (!started()) await sleep(5);
  req.destroy();
}

describe.each([
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
])('%s: a client leaving before the first byte of a piped answer', (_name, factory) => {
  let server: Server;
  let url: string;
  let runs: number;
  let store: ReturnType<typeof countingRenewals>;
  beforeEach(async () => {
    runs = 0;
    store = countingRenewals(new MemoryStore());
    const app = factory();
    // Renewed every 100 ms while the lease is held.
    app.use(idempotency({ store, lockTimeout: 300 }));
    // The handler answers after its client left: `send` stops at the closed response before reading the file.
    app.post('/file-after-leaving', (_req, res) => {
      runs++;
      res.once('close', () => res.sendFile(file));
    });
    // A source that has written nothing yet when the client leaves.
    app.post('/pipe-before-first-byte', (_req, res) => {
      runs++;
      const source = new PassThrough();
      res.once('close', () => source.destroy());
      source.pipe(res);
    });
    server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  test.each(['/file-after-leaving', '/pipe-before-first-byte'])(
    '%s: recorded as executed (the retry gets a 410), and renewals stop',
    async (path) => {
      const key = `key-${randomUUID()}`;
      await leaveOnceStarted(url, path, key, () => runs === 1);
      // Past the lease: a key still held would be renewed and answer 409.
      await sleep(400);
      const retry = await request(url).post(path).set('Idempotency-Key', key);
      expect(retry.status).toBe(410);
      expect(retry.body.type).toBe('https://oncely.dev/problems/response-not-stored');
      expect(runs).toBe(1);
      const renewals = store.renewals;
      await sleep(400);
      expect(store.renewals).toBe(renewals);
    },
  );
});
