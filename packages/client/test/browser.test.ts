/**
 * @services chromium
 */
// The client in a real browser: headless Chromium (Debian's package, driven by playwright-core, which downloads no
// browser) loads a page from a local Express server with oncely on it, imports the client's sources bundled for the
// browser by esbuild, and calls the same origin: no CORS, no mocks, the browser's own fetch, timers and crypto.
import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { delimiter, join } from 'node:path';
import { MemoryStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { build } from 'esbuild';
import express, { type Request, type Response } from 'express';
import { type Browser, chromium, type Page } from 'playwright-core';

import type { RetryEvent } from '../src';
import { flushableWaits } from './servers';

type Client = typeof import('../src');

declare global {
  interface Window {
    /** The client's exports, set by the page's module script once it has loaded. */
    oncely: Client;
  }
}

jest.setTimeout(60_000);

/** Debian's Chromium, else one on PATH (what `@services chromium` looks for). */
function chromiumPath(): string {
  if (existsSync('/usr/bin/chromium')) return '/usr/bin/chromium';
  const dir = (process.env.PATH ?? '')
    .split(delimiter)
    .find((d) => d !== '' && existsSync(join(d, 'chromium')));
  if (dir === undefined) throw new Error('no chromium: bash scripts/services.sh installs it');
  return join(dir, 'chromium');
}

/** The client's sources as one ES module for the browser; esbuild fails on any `node:` import. */
async function bundle(): Promise<string> {
  const result = await build({
    entryPoints: [join(__dirname, '../src/index.ts')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    write: false,
    logLevel: 'silent',
  });
  const [file] = result.outputFiles;
  if (file === undefined) throw new Error('esbuild produced no output');
  return file.text;
}

const PAGE = `<!doctype html>
<html>
  <head><meta charset="utf-8"><title>@oncely/client in a browser</title></head>
  <body>
    <script type="module">
      import * as oncely from '/client.js';
      window.oncely = oncely;
    </script>
  </body>
</html>
`;

/** One request that reached the server (before oncely), and the status it was answered with, once sent. */
interface Seen {
  path: string;
  key: string | null;
  status?: number;
}

interface PageServer {
  url: string;
  seen: Seen[];
  /** Runs of the route's handler (oncely's replays and 409s are not runs). */
  runs: Map<string, number>;
  reset(): void;
  close(): Promise<void>;
}

/**
 * Same origin, three things: the page, the client's bundle, and oncely-covered routes:
 * - `POST /charges?delay=ms`: 201 `{ id: n, amount, key }` after `delay` (n counts the runs);
 * - `POST /unavailable`: always 503 with `Retry-After: 600`.
 */
async function startPageServer(script: string): Promise<PageServer> {
  const seen: Seen[] = [];
  const runs = new Map<string, number>();
  const run = (route: string) => {
    const n = (runs.get(route) ?? 0) + 1;
    runs.set(route, n);
    return n;
  };
  const { wait, flush } = flushableWaits();

  const app = express();
  app.use((req: Request, res: Response, next) => {
    if (req.method === 'POST') {
      const entry: Seen = { path: req.path, key: req.get('idempotency-key') ?? null };
      seen.push(entry);
      res.on('finish', () => {
        entry.status = res.statusCode;
      });
    }
    next();
  });
  app.get('/', (_req: Request, res: Response) => void res.type('html').send(PAGE));
  app.get('/client.js', (_req: Request, res: Response) => void res.type('text/javascript').send(script));
  app.use(express.json());
  app.use(idempotency({ store: new MemoryStore() }));
  app.post('/charges', async (req: Request, res: Response) => {
    const n = run('charges');
    await wait(Number(req.query.delay ?? 0));
    res.status(201).json({ id: n, amount: req.body?.amount ?? null, key: req.idempotencyKey ?? null });
  });
  app.post('/unavailable', (_req: Request, res: Response) => {
    const n = run('unavailable');
    res.status(503).setHeader('retry-after', '600');
    res.json({ n });
  });

  const server: Server = createServer(app);
  server.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    runs,
    reset: () => {
      seen.length = 0;
      runs.clear();
    },
    close: () =>
      new Promise<void>((resolve) => {
        flush();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('@oncely/client in headless Chromium, against a local page with oncely on the same origin', () => {
  let server: PageServer | undefined;
  let browser: Browser | undefined;
  let page: Page;
  let pageErrors: string[];

  beforeAll(async () => {
    server = await startPageServer(await bundle());
    browser = await chromium.launch({
      executablePath: chromiumPath(),
      headless: true,
      chromiumSandbox: false, // root: --no-sandbox
      // Playwright gives it a new, empty --user-data-dir of its own, and removes it on close. This machine's network
      // is closed: without the background-networking flags Chromium keeps trying to reach Google's hosts.
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
  });

  afterAll(async () => {
    try {
      await browser?.close();
    } finally {
      await server?.close();
    }
  });

  beforeEach(async () => {
    server?.reset();
    pageErrors = [];
    page = await (browser as Browser).newPage();
    page.on('pageerror', (error) => pageErrors.push(String(error)));
    await page.goto(`${(server as PageServer).url}/`);
    await page.waitForFunction(() => typeof window.oncely?.idempotentFetch === 'function');
  });

  afterEach(async () => {
    await page.close();
    expect(pageErrors).toEqual([]);
  });

  test('a handler slower than the timeout: the same key through the timeout and 409s to the replay; one run', async () => {
    const app = server as PageServer;
    // Runs in the page: only the browser's own APIs, and the client the page imported.
    const result = await page.evaluate(async () => {
      const retries: (number | string)[] = [];
      const api = window.oncely.idempotentFetch({
        timeout: 300,
        baseDelay: 50,
        maxDelay: 100,
        maxAttempts: 100,
        deadline: 40_000,
        onRetry: (event) =>
          retries.push(event.previous.kind === 'response' ? event.previous.status : event.previous.kind),
      });
      const res = await api('/charges?delay=1500', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ amount: 42 }),
      });
      return {
        status: res.status,
        replayed: res.headers.get('idempotent-replayed'),
        body: await res.json(),
        retries,
      };
    });

    const charges = app.seen.filter((s) => s.path === '/charges');
    const key = charges[0]?.key;
    expect(key).toMatch(UUID); // crypto.randomUUID: 127.0.0.1 is a secure context
    // One object, so that a failure shows the whole story.
    expect({
      runs: app.runs.get('charges'),
      keys: charges.map((s) => s.key),
      status: result.status,
      replayed: result.replayed,
      body: result.body,
      firstRetryAfter: result.retries[0],
    }).toEqual({
      runs: 1,
      keys: charges.map(() => key),
      status: 201,
      replayed: 'true',
      body: { id: 1, amount: 42, key },
      firstRetryAfter: 'timeout',
    });
    expect(result.retries).toContain(409);
    // The timed-out first attempt, at least one 409, and the replay.
    expect(charges.length).toBeGreaterThanOrEqual(3);
    expect(charges.length).toBeLessThanOrEqual(result.retries.length + 1);
  });

  test('422 (a key reused for a different body) is returned, not retried: one attempt for that call', async () => {
    const app = server as PageServer;
    const result = await page.evaluate(async () => {
      let retries = 0;
      const api = window.oncely.idempotentFetch({ baseDelay: 50, onRetry: () => void retries++ });
      const key = `browser-422-${crypto.randomUUID()}`;
      const post = (amount: number) =>
        api('/charges', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ amount }),
          key,
        });
      const first = await post(1);
      const second = await post(2);
      return {
        key,
        first: first.status,
        second: second.status,
        problem: (await second.json()).type,
        retries,
      };
    });

    expect(result).toEqual({
      key: expect.stringMatching(/^browser-422-/),
      first: 201,
      second: 422,
      problem: 'https://oncely.dev/problems/key-reused',
      retries: 0,
    });
    // What the server saw with that key: the first call's one attempt, then the second call's one attempt.
    expect(app.seen.filter((s) => s.key === result.key).map((s) => s.status)).toEqual([201, 422]);
    expect(app.runs.get('charges')).toBe(1);
  });

  test('an abort during the wait between attempts rejects at once with the signal’s reason', async () => {
    const app = server as PageServer;
    const result = await page.evaluate(async () => {
      const controller = new AbortController();
      let retried: (event: RetryEvent) => void = () => {};
      const retry = new Promise<RetryEvent>((resolve) => {
        retried = resolve;
      });
      // Retry-After: 600 is honoured in full: the wait after the first 503 is ten minutes, so only the abort can end
      // the call within the test's timeout.
      const api = window.oncely.idempotentFetch({
        maxRetryAfter: 600_000,
        deadline: Infinity,
        onRetry: (event) => retried(event),
      });
      const settled = api('/unavailable', { method: 'POST', body: 'x', signal: controller.signal }).then(
        () => ({ rejected: false, error: undefined as unknown }),
        (error: unknown) => ({ rejected: true, error }),
      );
      const event = await retry;
      // onRetry runs just before the wait starts; a later task aborts during it.
      await new Promise((resolve) => setTimeout(resolve, 100));
      controller.abort();
      // Not a measure of time: it turns a call that the abort failed to end into a failure that says so.
      const stillPending = new Promise<{ rejected: boolean; error: unknown }>((resolve) =>
        setTimeout(() => resolve({ rejected: false, error: 'still pending 20 s after the abort' }), 20_000),
      );
      const { rejected, error } = await Promise.race([settled, stillPending]);
      return {
        delayMs: event.delayMs,
        previous: event.previous,
        key: event.key,
        rejected,
        isTheReason: error === controller.signal.reason,
        name: typeof error === 'string' ? error : (error as { name?: string } | undefined)?.name,
      };
    });

    expect(result).toEqual({
      delayMs: 600_000,
      previous: expect.objectContaining({ attempt: 1, kind: 'response', status: 503, retryAfterMs: 600_000 }),
      key: expect.stringMatching(UUID),
      rejected: true,
      isTheReason: true,
      name: 'AbortError',
    });
    expect(app.seen.filter((s) => s.path === '/unavailable')).toEqual([
      { path: '/unavailable', key: result.key, status: 503 },
    ]);
    expect(app.runs.get('unavailable')).toBe(1);
  });
});
