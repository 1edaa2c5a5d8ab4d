import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import request from 'supertest';

/**
 * Helpers for a store's outage tests (a private database killed, restarted, paused): the same requests and the same
 * checks for every store, so that what one store is held to, the next one is too.
 */

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Retries `check` every 50 ms until it resolves true (a rejection counts as false); throws after `timeoutMs`. */
export async function until(check: () => Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error(`condition not met in ${timeoutMs} ms`);
}

/** The answer to a covered request while the store is down: 503 problem+json. */
export function expect503(res: request.Response): void {
  expect(res.status).toBe(503);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(res.body.status).toBe(503);
}

/** The answer to a transactional request whose COMMIT got no answer: 503 `commit-outcome-unknown`, retry in 1 s. */
export function expectCommitUnknown(res: request.Response): void {
  expect503(res);
  expect(res.headers['retry-after']).toBe('1');
  expect(res.body.type).toBe('https://oncely.dev/problems/commit-outcome-unknown');
}

/**
 * `send`'s answer once it is not a 409: a retry right after a cut connection may find the key still held by the
 * session the server has not yet seen close.
 */
export async function onceFree(send: () => Promise<request.Response>): Promise<request.Response> {
  let res: request.Response | undefined;
  await until(async () => {
    res = await send();
    return res.status !== 409;
  });
  return res as request.Response;
}

/** Listens on a free port of 127.0.0.1; the server joins `servers`, for `closeServers`. */
export async function listen(
  app: { listen(port: number, host: string): Server },
  servers: Server[],
): Promise<string> {
  const listening = app.listen(0, '127.0.0.1');
  servers.push(listening);
  await new Promise((resolve) => listening.once('listening', resolve));
  return `http://127.0.0.1:${(listening.address() as AddressInfo).port}`;
}

export function closeServers(servers: Server[]): void {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
}

/** A handler held mid-request: it calls `enter()` and awaits `wait`; the test awaits `entered`, then `open()`s. */
export interface Gate {
  wait: Promise<void>;
  open: () => void;
  entered: Promise<void>;
  enter: () => void;
}

export function gate(): Gate {
  let open!: () => void;
  let enter!: () => void;
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  const entered = new Promise<void>((resolve) => {
    enter = resolve;
  });
  return { wait, open, entered, enter };
}

/**
 * A route handler for outage tests (Express's signature): counts its runs per key in `runs`, runs `write` (the
 * business write, through the request's transaction), holds at the key's gate if there is one, then answers 201.
 */
export function gatedRoute<Req extends { idempotencyKey?: string | undefined }>(
  runs: Map<string, number>,
  gates: Map<string, Gate>,
  write: (req: Req, key: string) => Promise<unknown>,
) {
  return async (
    req: Req,
    res: { status(code: number): { json(body: unknown): unknown } },
    next: (error: unknown) => void,
  ): Promise<void> => {
    const key = req.idempotencyKey ?? '';
    runs.set(key, (runs.get(key) ?? 0) + 1);
    try {
      await write(req, key);
      const held = gates.get(key);
      held?.enter();
      await held?.wait;
      res.status(201).json({ ok: true });
    } catch (error) {
      next(error);
    }
  };
}

/** An app under test: `post(key)` sends a covered request; `runs` counts the handler's runs per key. */
export interface OutageApp {
  post(key: string): Promise<request.Response>;
  runs: Map<string, number>;
}

/**
 * Kills the server: four covered requests (two keys, one twice, and `stored`, a key completed before) get 503 at
 * once and the handler does not run. Restarts it: the same app serves the keys once each, and `stored` replays.
 * Resolves with how long the 503s took.
 */
export async function killAndRestart(
  server: { kill(): Promise<void>; restart(): Promise<void> },
  app: OutageApp,
  [k1, k2, stored]: [string, string, string],
): Promise<number> {
  expect((await app.post(stored)).status).toBe(201);
  await server.kill();
  const started = Date.now();
  const down = await Promise.all([k1, k2, k1, stored].map((key) => app.post(key)));
  const elapsed = Date.now() - started;
  for (const res of down) expect503(res);
  // Generous bound: a pool waiting for a connection with no timeout would never answer.
  expect(elapsed).toBeLessThan(5000);
  expect([app.runs.get(k1), app.runs.get(k2)]).toEqual([undefined, undefined]);

  await server.restart();
  await until(async () => (await app.post(k1)).status === 201);
  const replay = await app.post(k1);
  expect(replay.status).toBe(201);
  expect(replay.headers['idempotent-replayed']).toBe('true');
  // The key stored before the outage survived it: the record is in the database, not in the process.
  expect((await app.post(stored)).headers['idempotent-replayed']).toBe('true');
  expect((await app.post(k2)).status).toBe(201);
  expect([app.runs.get(k1), app.runs.get(k2), app.runs.get(stored)]).toEqual([1, 1, 1]);
  return elapsed;
}

/**
 * After a resume: sends each key until it is served, and checks that it was answered only 409 (a lease reserved by
 * an acquire that ran after its client gave up) before, then replays, the handler having run once. Resolves with
 * the answers per key.
 */
export async function servedAfterResume(app: OutageApp, keys: string[]): Promise<Map<string, number[]>> {
  const seen = new Map<string, number[]>();
  for (const key of keys) {
    const answers: number[] = [];
    seen.set(key, answers);
    await until(async () => {
      const { status } = await app.post(key);
      answers.push(status);
      return status === 201;
    });
  }
  for (const key of keys) {
    // A held key answers 409 (in progress) until it is released; never a 5xx once the server is back.
    expect((seen.get(key) ?? []).slice(0, -1).every((status) => status === 409)).toBe(true);
    expect((await app.post(key)).headers['idempotent-replayed']).toBe('true');
    expect(app.runs.get(key)).toBe(1);
  }
  return seen;
}

/** A covered `POST /charges` for `key`, as every outage app takes it. */
export function postCharge(url: string, key: string): request.Test {
  return request(url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 });
}

/** What a test file's outage apps share: handler runs and gates per key, and the servers to close. */
export interface OutageState {
  runs: Map<string, number>;
  gates: Map<string, Gate>;
  servers: Server[];
}

/** An outage app served on a port of its own; `gates` holds its handler at a key. */
export interface ServedOutageApp extends OutageApp {
  url: string;
  gates: Map<string, Gate>;
}

/**
 * Serves an Express app behind `middleware` (the adapter's, on the store under test) whose `POST /charges` is a
 * `gatedRoute` running `write`, the business write of transactional mode (none in plain mode).
 */
export async function serveOutageApp(
  middleware: express.RequestHandler,
  state: OutageState,
  write: (req: express.Request, key: string) => Promise<unknown> = async () => {},
): Promise<ServedOutageApp> {
  const app = express();
  app.use(express.json());
  app.use(middleware);
  app.post('/charges', gatedRoute(state.runs, state.gates, write));
  const url = await listen(app, state.servers);
  return { url, post: (key) => postCharge(url, key), runs: state.runs, gates: state.gates };
}

/**
 * A file's last step: closes its apps' servers, resumes the server (were a test to fail while it is paused), ends the
 * pools (ignoring their errors: some connections died with the server) and stops the server.
 */
export async function endOutages(
  state: OutageState,
  server: { resume(): void; stop(): Promise<void> } | undefined,
  pools: { end(): Promise<void> }[],
): Promise<void> {
  closeServers(state.servers);
  server?.resume();
  await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
  await server?.stop();
}

/** How an outage test reads the database: `ready` once it answers again, `rows` the committed business rows of a key. */
export interface OutageChecks {
  ready(): Promise<boolean>;
  rows(key: string): Promise<number>;
}

/**
 * Kills the server while a transactional request is held after its write (`key`, once `warm` has been served): the
 * request gets a 5xx problem+json and, while the server is down, the key 503 without a run. Restarts it: the write
 * was rolled back, `afterRestart` checks more, and the key runs again once. Resolves with the in-flight answer.
 */
export async function killInFlight(
  server: { kill(): Promise<void>; restart(): Promise<void> },
  app: ServedOutageApp,
  checks: OutageChecks & { afterRestart?(): Promise<void> },
  [warm, key]: [string, string],
): Promise<request.Response> {
  await until(async () => (await app.post(warm)).status === 201);
  const g = gate();
  app.gates.set(key, g);
  const inFlight = app.post(key).then((res) => res); // sent now (supertest sends on then)
  await g.entered; // the handler's row is written, its transaction open
  await server.kill();
  g.open(); // the handler answers 201; the commit cannot happen
  const res = await inFlight;
  expect(res.status).toBeGreaterThanOrEqual(500);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(app.runs.get(key)).toBe(1);
  expect503(await app.post(key));
  expect(app.runs.get(key)).toBe(1);

  app.gates.delete(key);
  await server.restart();
  await until(checks.ready);
  expect(await checks.rows(key)).toBe(0); // rolled back: the crash took the open transaction with it
  await checks.afterRestart?.();
  await until(async () => (await app.post(key)).status === 201);
  expect(app.runs.get(key)).toBe(2); // the in-flight run (rolled back) and this one
  expect(await checks.rows(key)).toBe(1);
  expect((await app.post(key)).headers['idempotent-replayed']).toBe('true');
  expect(app.runs.get(key)).toBe(2);
  expect(await checks.rows(key)).toBe(1);
  return res;
}

/**
 * Pauses the server: two covered transactional requests (`keys`, once `warm` has been served) get 503 within 10 s
 * and the handler does not run. Resumes it: each key is served once (`servedAfterResume`) and its row is kept.
 * Resolves with how long the 503s took and the answers per key after the resume.
 */
export async function pauseInFlight(
  server: { pause(): void; resume(): void },
  app: OutageApp,
  checks: OutageChecks,
  [warm, ...keys]: [string, string, string],
): Promise<{ elapsed: number; seen: Map<string, number[]> }> {
  await until(async () => (await app.post(warm)).status === 201);
  server.pause();
  let elapsed: number;
  try {
    const started = Date.now();
    const down = await Promise.all(keys.map((key) => app.post(key)));
    elapsed = Date.now() - started;
    for (const res of down) expect503(res);
    // Generous bound: without the pool's timeouts the requests would wait for the resume.
    expect(elapsed).toBeLessThan(10_000);
    expect(keys.map((key) => app.runs.get(key))).toEqual([undefined, undefined]);
  } finally {
    server.resume();
  }
  await until(checks.ready);
  const seen = await servedAfterResume(app, keys);
  for (const key of keys) expect(await checks.rows(key)).toBe(1);
  return { elapsed, seen };
}

/** No handler ran twice for one key over a file's outages, but `rolledBack`, whose first run was rolled back. */
export function expectRanOnceEach(runs: Map<string, number>, rolledBack: string, atLeast: number): void {
  expect([...runs].filter(([key, n]) => n !== 1 && key !== rolledBack)).toEqual([]);
  expect(runs.get(rolledBack)).toBe(2);
  expect(runs.size).toBeGreaterThanOrEqual(atLeast);
}
