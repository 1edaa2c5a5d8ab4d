import { randomUUID } from 'node:crypto';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { inspect } from 'node:util';
import type { IdempotencyOptions, IdempotencyStore, Logger } from '@oncely/core';
import fc from 'fast-check';
import type { RedisClientLike } from './suite-types';

/*
 * The model-based test: random sequences of requests against one adapter on one store, and after each sequence the
 * invariants every adapter must keep, whatever the handler does and whenever the client leaves:
 * - the process lives (no uncaught exception, no unhandled rejection);
 * - no answer carries another scope's data;
 * - a replay is, byte for byte, the answer the handler gave to the first request (status, stored headers, body),
 *   and only to a request with the same fingerprint;
 * - no key stays locked past its lease once no handler runs;
 * - a handler runs at most once per (scope, key), unless its earlier runs released the key.
 *
 * Every adapter serves the same app (`ModelAppFactory`), described on `ModelRoute`. Replay a failure with the seed
 * and path it prints: ONCELY_MODEL_SEED=<seed> ONCELY_MODEL_PATH=<path> npx jest <file> -t '<test name>'.
 */

/**
 * The routes of a model app, all POST. Each reads `x-user` (the caller) and `x-delay` (ms to wait before answering),
 * opens a run with `recorder.begin`, and sends what the recorder says, with `x-run` and `x-owner` headers.
 * Two registrations (`modelOptions`): a public one (`scope: false`) over `/p` and `/n`, as an app-wide one is, and a
 * per-user one (scope `x-user`, and a `cacheable` that throws for 418) on each `/u` and `/n` route.
 * - `/p/json`: 201 JSON; `/p/text`: 201 text/plain, for a text/plain body (parsed before oncely, as the docs ask).
 *   Public: one record per key for everybody.
 * - `/n/json`: 201 JSON, under both registrations (nested): it must keep to its per-user scope, or be refused.
 * - `/u/json`: 201 JSON. `/u/fail`: 503 JSON. `/u/teapot`: 418 JSON (the route's `cacheable` throws for it).
 * - `/u/throw`: throws synchronously; `/u/reject`: fails asynchronously; the app's error handler answers 500.
 * - `/u/bad-status`: sets a status the framework or Node refuses (Express: `res.statusCode = undefined`, as an
 *   error handler copying `err.status` of an error without one does), then sends.
 * - `/u/stream`: 200 octet-stream, `streamChunks(run)`, `nextChunk()` apart (Express: `Readable.pipe`).
 * - `/u/buffer`: 200 octet-stream, a Buffer from the app's pool (`recorder.pool`) filled for this run, given back
 *   to the pool (and overwritten) once the response is done with it.
 */
export const MODEL_ROUTES = [
  '/p/json',
  '/p/text',
  '/n/json',
  '/u/json',
  '/u/fail',
  '/u/teapot',
  '/u/throw',
  '/u/reject',
  '/u/bad-status',
  '/u/stream',
  '/u/buffer',
] as const;
export type ModelRoute = (typeof MODEL_ROUTES)[number];

/** Routes whose run must release the key: a 5xx, an error, a status nobody may store. */
const RELEASING: ReadonlySet<ModelRoute> = new Set([
  '/u/fail',
  '/u/teapot',
  '/u/throw',
  '/u/reject',
  '/u/bad-status',
]);

/** The scope a request's record belongs to: one per user under `/u` and `/n`, one for everybody under `/p`. */
export function scopeOf(route: string, user: string): string {
  return route.startsWith('/p/') ? 'public' : `user:${user}`;
}

/** One execution of a handler, as the handler reports it. */
export interface ModelRun {
  id: number;
  route: ModelRoute;
  user: string;
  scope: string;
  key: string;
  /** The request body the handler received, as text. */
  body: string;
  start: number;
  /** When the handler was done producing its answer (sent, thrown, or its stream ended or was cut). */
  handed?: number;
  /** When the response closed (Node's `close`); until then the run counts as in flight. */
  closed?: number;
  /** The response closed before it was finished: the client left. */
  leftEarly: boolean;
  status?: number;
  contentType?: string;
  bytes?: Buffer;
}

/** What a handler of the model app reports and sends; one per run. */
export class RunHandle {
  constructor(
    readonly run: ModelRun,
    private readonly onClosed: () => void,
  ) {}
  get id(): number {
    return this.run.id;
  }
  get owner(): string {
    return this.run.user;
  }
  /** The headers every answer of a run carries. */
  headers(): Record<string, string> {
    return { 'x-run': String(this.run.id), 'x-owner': this.run.user };
  }
  /** Records the answer the handler is about to send (a copy of its bytes); a streamed one is handed once it ends. */
  answer(status: number, contentType: string, bytes: Uint8Array, streamed = false): void {
    this.run.status = status;
    this.run.contentType = contentType;
    this.run.bytes = Buffer.from(bytes);
    if (!streamed) this.handed();
  }
  /** The handler is done producing (it threw, or its stream ended or was cut). */
  handed(): void {
    this.run.handed ??= Date.now();
  }
  /** The response closed; `finished` is whether it was sent whole. */
  closed(finished: boolean): void {
    if (this.run.closed !== undefined) return;
    this.handed();
    this.run.closed = Date.now();
    this.run.leftEarly = !finished;
    this.onClosed();
  }
  /** Marks the run closed when Node's response closes. */
  watch(res: { once(event: 'close', listener: () => void): unknown; writableFinished: boolean }): void {
    res.once('close', () => this.closed(res.writableFinished));
  }
  /** The JSON body of this run. */
  json(): Buffer {
    return Buffer.from(JSON.stringify({ owner: this.run.user, run: this.run.id, body: this.run.body }));
  }
  /** The text/plain body of this run. */
  text(): Buffer {
    return Buffer.from(`owner=${this.run.user} run=${this.run.id} body=${this.run.body}`);
  }
  /** The streamed body of this run: 8 chunks of 256 bytes naming the owner and the run. */
  streamChunks(): Buffer[] {
    const unit = Buffer.from(`${this.run.user}:${this.run.id};`);
    return Array.from({ length: 8 }, (_, i) => {
      const chunk = Buffer.alloc(256);
      chunk.fill(unit);
      chunk[0] = 48 + i;
      return chunk;
    });
  }
  /** Fills a pooled buffer with this run's bytes: `owner:run` padded with dots to 64 bytes. */
  fill(buffer: Buffer): Buffer {
    buffer.fill('.');
    buffer.write(`${this.run.user}:${this.run.id}`);
    return buffer;
  }
}

/** A pool of 64-byte buffers, as a handler that recycles its buffers has: a buffer given back is overwritten. */
export class BufferPool {
  private readonly free: Buffer[] = [];
  take(): Buffer {
    return this.free.pop() ?? Buffer.alloc(64);
  }
  give(buffer: Buffer): void {
    buffer.fill('#');
    this.free.push(buffer);
  }
}

/** The handler runs of one model app, for the invariants. */
export class ModelRecorder {
  readonly runs: ModelRun[] = [];
  readonly pool = new BufferPool();
  private open = 0;
  private next = 1;
  begin(route: ModelRoute, headers: IncomingHttpHeaders | Headers, body: string): RunHandle {
    const get = (name: string) =>
      headers instanceof Headers ? (headers.get(name) ?? '') : String(headers[name] ?? '');
    const user = get('x-user');
    const run: ModelRun = {
      id: this.next++,
      route,
      user,
      scope: scopeOf(route, user),
      key: get('idempotency-key'),
      body,
      start: Date.now(),
      leftEarly: false,
    };
    this.runs.push(run);
    this.open++;
    return new RunHandle(run, () => {
      this.open--;
    });
  }
  /** Runs whose response has not closed yet. */
  inFlight(): ModelRun[] {
    return this.runs.filter((run) => run.closed === undefined);
  }
  get openCount(): number {
    return this.open;
  }
}

/** The milliseconds a route's handler waits before answering (`x-delay`). */
export function delayOf(headers: IncomingHttpHeaders | Headers): number {
  const value = headers instanceof Headers ? headers.get('x-delay') : headers['x-delay'];
  return Number(value ?? 0) || 0;
}

export const later = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The pause between two chunks of `/u/stream`: long enough for a client to leave halfway through the stream. */
export const nextChunk = () => later(4);

/** What a model app is built with. */
export interface ModelAppOptions {
  store: IdempotencyStore;
  lockTimeout: number;
  recorder: ModelRecorder;
  logger: Logger;
}

/** A listening model app. */
export interface ModelApp {
  url: string;
  close(): Promise<void>;
}

export type ModelAppFactory = (options: ModelAppOptions) => Promise<ModelApp>;

/**
 * The options of the two registrations, for a request type whose headers `headersOf` reads: the public one over
 * `/p` and `/n` (`scope: false`) and the per-user one of the `/u` and `/n` routes (and a `cacheable` that throws for
 * 418).
 */
export function modelOptions<Req>(
  options: ModelAppOptions,
  headersOf: (request: Req) => IncomingHttpHeaders | Headers,
): { appWide: IdempotencyOptions<Req>; perUser: IdempotencyOptions<Req> } {
  const common = { store: options.store, lockTimeout: options.lockTimeout, logger: options.logger };
  return {
    appWide: { ...common, scope: false },
    perUser: {
      ...common,
      scope: (request) => {
        const headers = headersOf(request);
        return `user:${headers instanceof Headers ? headers.get('x-user') : headers['x-user']}`;
      },
      cacheable: (status) => {
        if (status === 418) throw new Error(`cacheable was not written for ${status}`);
        return status < 500;
      },
    },
  };
}

/** One step of a sequence: a request (sent `copies` times at once), awaited or left running in the background. */
export interface ModelStep {
  user: 'alice' | 'bob' | 'carol';
  key: 'k1' | 'k2' | 'k3';
  route: ModelRoute;
  amount: 1 | 2;
  delay: number;
  copies: number;
  /** The first copy's client leaves after this many ms (null: it waits for the answer). */
  leaveAfter: number | null;
  background: boolean;
}

/** Steps over `routes` (all by default; the JSON routes drawn more often, as most requests of an app are those). */
function stepArbitrary(routes: readonly ModelRoute[]): fc.Arbitrary<ModelStep> {
  const common = routes.filter((route) => route === '/u/json' || route === '/p/json' || route === '/n/json');
  return fc.record({
    user: fc.constantFrom('alice', 'bob', 'carol'),
    key: fc.constantFrom('k1', 'k2', 'k3'),
    route:
      common.length === 0 || common.length === routes.length
        ? fc.constantFrom(...routes)
        : fc.oneof(
            { weight: 3, arbitrary: fc.constantFrom(...common) },
            { weight: 5, arbitrary: fc.constantFrom(...routes) },
          ),
    amount: fc.constantFrom(1, 2),
    delay: fc.constantFrom(0, 0, 15, 60),
    copies: fc.constantFrom(1, 1, 1, 2, 3),
    // One client in five leaves (shrunk towards one that stays).
    leaveAfter: fc.oneof(
      { weight: 4, arbitrary: fc.constant(null) },
      { weight: 1, arbitrary: fc.constantFrom(0, 5, 20, 50) },
    ),
    background: fc.boolean(),
  });
}

/** An answer as the client got it. */
interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** One request sent, and what became of it. */
interface Sent {
  label: string;
  step: ModelStep;
  key: string;
  body: string;
  answer?: Answer;
  /** The client left before the answer was whole. */
  left: boolean;
  /** No answer within the client's patience, or a connection error while the client was waiting. */
  failure?: string;
}

const ANSWER_PATIENCE_MS = 4_000;

function bodyOf(step: ModelStep): { body: string; contentType: string } {
  return step.route === '/p/text'
    ? { body: `text-${step.amount}`, contentType: 'text/plain' }
    : { body: JSON.stringify({ amount: step.amount }), contentType: 'application/json' };
}

function send(
  url: string,
  step: ModelStep,
  key: string,
  leaveAfter: number | null,
  label: string,
): Promise<Sent> {
  const { body, contentType } = bodyOf(step);
  const target = new URL(step.route, url);
  const sent: Sent = { label, step, key, body, left: false };
  return new Promise<Sent>((resolve) => {
    let settled = false;
    const done = () => {
      if (settled) return;
      settled = true;
      clearTimeout(patience);
      if (leaving !== undefined) clearTimeout(leaving);
      resolve(sent);
    };
    const req = httpRequest(target, {
      method: 'POST',
      agent: false,
      headers: {
        'content-type': contentType,
        'content-length': Buffer.byteLength(body),
        'idempotency-key': key,
        'x-user': step.user,
        'x-delay': String(step.delay),
      },
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        sent.answer = { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) };
        done();
      });
      res.on('error', () => {});
      res.on('aborted', () => {
        if (!sent.left) sent.failure = 'the answer was cut off';
        done();
      });
    });
    req.on('error', (error) => {
      if (!sent.left) sent.failure = `connection error: ${error.message}`;
      done();
    });
    req.on('close', () => {
      if (!settled && !sent.left && sent.answer === undefined) sent.failure ??= 'closed without an answer';
      setImmediate(done);
    });
    const patience = setTimeout(() => {
      sent.failure = `no answer within ${ANSWER_PATIENCE_MS} ms`;
      req.destroy();
      done();
    }, ANSWER_PATIENCE_MS);
    const leaving =
      leaveAfter === null
        ? undefined
        : setTimeout(() => {
            if (sent.answer !== undefined) return;
            sent.left = true;
            req.destroy();
            done();
          }, leaveAfter);
    req.end(body);
  });
}

/** The real process's event emitter: a jest test gets a copy of `process` whose listeners never hear Node's events. */
function hostProcess(): NodeJS.Process {
  // The Function constructor of a Node core module belongs to the host realm, where `process` is the real one.
  return (inspect.constructor as FunctionConstructor)('return process')() as NodeJS.Process;
}

/** Uncaught exceptions and unhandled rejections of the process while `watchProcess` runs. */
export interface ProcessWatch {
  events: string[];
  stop(): void;
}

export function watchProcess(): ProcessWatch {
  const host = hostProcess();
  const events: string[] = [];
  const describe = (error: unknown) =>
    error instanceof Error
      ? `${error.name}: ${error.message}${'code' in error ? ` (${String(error.code)})` : ''}`
      : String(error);
  const onException = (error: unknown) => events.push(`uncaughtException: ${describe(error)}`);
  const onRejection = (reason: unknown) => events.push(`unhandledRejection: ${describe(reason)}`);
  host.on('uncaughtException', onException);
  host.on('unhandledRejection', onRejection);
  return {
    events,
    stop() {
      host.off('uncaughtException', onException);
      host.off('unhandledRejection', onRejection);
    },
  };
}

/**
 * What the model watches beside the answers: the keys whose lease was lost (oncely logs each, with its key, when
 * the store refuses a write of a token whose lease ran out), and the longest the event loop stalled. A lease is
 * renewed every third of `lockTimeout`; a loaded machine that stalls the process longer than that can lose it, and
 * then running the key again is what oncely promises. Without such a stall, a lost lease is a bug.
 */
export interface LeaseWatch {
  logger: Logger;
  /** The storage keys (scope and client key) whose lease was lost. */
  lostKeys: string[];
  /** The longest the event loop was late, in ms, since the watch started. */
  maxStallMs(): number;
  stop(): void;
}

export function watchLeases(): LeaseWatch {
  const lostKeys: string[] = [];
  const noop = () => {};
  const logger: Logger = {
    debug: noop,
    info: noop,
    error: noop,
    warn(obj, msg) {
      const key = (obj as { key?: unknown }).key;
      if (typeof key === 'string' && msg?.includes('lost its lease')) lostKeys.push(key);
    },
  };
  const tick = 10;
  let expected = Date.now() + tick;
  let maxStall = 0;
  const timer = setInterval(() => {
    const now = Date.now();
    maxStall = Math.max(maxStall, now - expected);
    expected = now + tick;
  }, tick);
  timer.unref();
  return {
    logger,
    lostKeys,
    maxStallMs: () => Math.max(maxStall, Date.now() - expected),
    stop: () => clearInterval(timer),
  };
}

/** Checks one finished sequence; returns the broken invariants (empty if none). */
function violations(
  sents: Sent[],
  finals: Sent[],
  runs: ModelRun[],
  processEvents: string[],
  leases: { lostKeys: string[]; maxStallMs: number; lockTimeout: number },
): string[] {
  const found: string[] = [];
  // A stall of a renewal interval or more, with the slower steps around it, can let a lease run out unrenewed.
  const stalled = leases.maxStallMs >= leases.lockTimeout / 3;
  if (leases.lostKeys.length > 0 && !stalled)
    found.push(
      `[lease kept] ${leases.lostKeys.length} lease(s) lost though the event loop never stalled longer than ${leases.maxStallMs} ms (renewal every ${Math.round(leases.lockTimeout / 3)} ms)`,
    );
  const lost = (run: ModelRun) =>
    stalled && leases.lostKeys.some((k) => k === run.key || k.endsWith(` ${run.key}`));
  for (const event of processEvents) found.push(`[process alive] ${event}`);
  const byId = new Map(runs.map((run) => [run.id, run]));
  for (const sent of [...sents, ...finals]) {
    // A request whose handler failed may be answered by a destroyed socket; any other must be answered.
    if (sent.failure !== undefined && !sent.left && !RELEASING.has(sent.step.route))
      found.push(`[answered] ${sent.label}: ${sent.failure}`);
    const answer = sent.answer;
    if (answer === undefined) continue;
    const scope = scopeOf(sent.step.route, sent.step.user);
    const replayed = answer.headers['idempotent-replayed'] === 'true';
    const runHeader = answer.headers['x-run'];
    const what = `${sent.label} got ${answer.status}${replayed ? ' (replay)' : ''}`;
    if (runHeader === undefined) {
      // Problems (4xx/5xx of oncely or the app's error handler) carry no run; a handler's own answer always does.
      const fromHandler = answer.status < 300 || answer.status === 418 || answer.status === 503;
      if (fromHandler && !(replayed && answer.status === 410))
        found.push(`[replay = first answer] ${what} without x-run: ${preview(answer.body)}`);
      continue;
    }
    const run = byId.get(Number(runHeader));
    if (run === undefined) {
      found.push(`[replay = first answer] ${what} names run ${runHeader}, which never ran`);
      continue;
    }
    if (run.scope !== scope || run.key !== sent.key)
      found.push(
        `[no other scope's data] ${what} carrying run ${run.id} of ${run.scope} key ${run.key} (${run.route}, ${run.user})`,
      );
    if (answer.headers['x-owner'] !== run.user)
      found.push(
        `[no other scope's data] ${what}: x-owner ${answer.headers['x-owner']} for run ${run.id} of ${run.user}`,
      );
    if (replayed && (run.route !== sent.step.route || run.body !== sent.body))
      found.push(
        `[replay = first answer] ${what}: replayed run ${run.id} of ${run.route} ${run.body} to a request for ${sent.step.route} ${sent.body} (should be 422)`,
      );
    if (replayed && RELEASING.has(run.route))
      found.push(
        `[replay = first answer] ${what}: replayed run ${run.id} of ${run.route}, which must release the key`,
      );
    // A live answer other than the handler's (the 500 of a failure oncely or the app's error handler sent instead)
    // still carries the run's headers: only the handler's own answer, and every replay, must be its bytes.
    const handlers = replayed ? answer.status !== 410 : answer.status === run.status;
    if (run.bytes !== undefined && handlers) {
      if (answer.status !== run.status)
        found.push(`[replay = first answer] ${what}: run ${run.id} answered ${run.status}`);
      if (!answer.body.equals(run.bytes))
        found.push(
          `[replay = first answer] ${what}: body ${preview(answer.body)} is not run ${run.id}'s ${preview(run.bytes)}`,
        );
      const type = String(answer.headers['content-type'] ?? '').split(';')[0];
      if (type !== run.contentType)
        found.push(
          `[replay = first answer] ${what}: content-type ${type}, run ${run.id} sent ${run.contentType}`,
        );
    }
  }
  for (const sent of finals) {
    if (sent.answer?.status === 409)
      found.push(
        `[no key locked past its lease] ${sent.label}: 409 although no handler runs and the lease has run out`,
      );
  }
  const groups = new Map<string, ModelRun[]>();
  for (const run of runs) {
    const group = `${run.scope} ${run.key}`;
    groups.set(group, [...(groups.get(group) ?? []), run]);
  }
  for (const [group, list] of groups) {
    list.sort((a, b) => a.start - b.start);
    list.forEach((run, i) => {
      for (const earlier of list.slice(0, i)) {
        // A run that lost its lease in a stall released its key, as a lapsed lease does.
        if (lost(earlier)) continue;
        if (earlier.handed === undefined || earlier.handed > run.start)
          found.push(
            `[at most once] ${group}: run ${run.id} (${run.route}) started while run ${earlier.id} (${earlier.route}) still ran`,
          );
        else if (!RELEASING.has(earlier.route) && !earlier.leftEarly)
          found.push(
            `[at most once] ${group}: run ${run.id} (${run.route}) ran again after run ${earlier.id} (${earlier.route}, ${earlier.status}) was answered`,
          );
      }
    });
  }
  return found;
}

function preview(bytes: Buffer): string {
  const text = bytes.toString('latin1');
  return JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}…(${text.length} bytes)` : text);
}

function describeSent(sent: Sent): string {
  const a = sent.answer;
  const outcome =
    a !== undefined
      ? `${a.status}${a.headers['idempotent-replayed'] === 'true' ? ' replay' : ''}${a.headers['x-run'] ? ` run ${a.headers['x-run']}` : ''}`
      : sent.left
        ? 'client left'
        : (sent.failure ?? 'no answer');
  return `${sent.label}: ${sent.step.user} ${sent.step.route} key ${sent.step.key} body ${sent.body} -> ${outcome}`;
}

/** A store the model runs on: made once per test, closed after all. */
export interface ModelStore {
  name: string;
  /** A store for one sequence; each sequence also uses keys of its own. */
  store(): IdempotencyStore;
  close?(): Promise<void>;
}

export const memoryModelStore = (make: () => IdempotencyStore): ModelStore => ({
  name: 'MemoryStore',
  store: make,
});

/**
 * A RedisStore under a prefix of this run's own (never flushed: every key of the prefix is deleted after all).
 */
export function redisModelStore<Client extends RedisClientLike>(
  connect: () => Client,
  makeStore: (client: Client, prefix: string) => IdempotencyStore & { close(): Promise<void> },
): ModelStore {
  let client: Client | undefined;
  let made: (IdempotencyStore & { close(): Promise<void> }) | undefined;
  const prefix = `oncely-model:${randomUUID()}:`;
  return {
    name: 'RedisStore',
    store() {
      client ??= connect();
      made ??= makeStore(client, prefix);
      return made;
    },
    async close() {
      await made?.close();
      if (client === undefined) return;
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      await client.quit();
    },
  };
}

/** Settings of a model run, from the environment (for replays) or these defaults. */
export interface ModelSettings {
  seed: number;
  runs: number;
  path?: string;
  lockTimeout: number;
  /** Stop shrinking a failure after this long (the failure found so far is reported). */
  timeLimitMs: number;
  /** The routes sequences draw from: all, or some to look at one class of failure. */
  routes: readonly ModelRoute[];
  /** Print every sequence, what it got and what it broke. */
  verbose: boolean;
}

export function modelSettings(env: NodeJS.ProcessEnv = process.env): ModelSettings {
  const number = (value: string | undefined, fallback: number) =>
    value === undefined || value === '' ? fallback : Number(value);
  return {
    seed: number(env.ONCELY_MODEL_SEED, 20_261_126),
    runs: number(env.ONCELY_MODEL_RUNS, 20),
    ...(env.ONCELY_MODEL_PATH ? { path: env.ONCELY_MODEL_PATH } : {}),
    lockTimeout: number(env.ONCELY_MODEL_LOCK_TIMEOUT, 600),
    timeLimitMs: number(env.ONCELY_MODEL_TIME_LIMIT, 40_000),
    routes: env.ONCELY_MODEL_ROUTES
      ? env.ONCELY_MODEL_ROUTES.split(',').map((route) => {
          const known = MODEL_ROUTES.find((r) => r === route.trim());
          if (known === undefined)
            throw new Error(`ONCELY_MODEL_ROUTES: unknown route ${route}; known: ${MODEL_ROUTES.join(', ')}`);
          return known;
        })
      : MODEL_ROUTES,
    verbose: env.ONCELY_MODEL_VERBOSE === '1',
  };
}

/** Runs one sequence against a fresh app; returns the broken invariants and a trace of what was sent. */
export async function runSequence(
  factory: ModelAppFactory,
  store: IdempotencyStore,
  steps: ModelStep[],
  lockTimeout: number,
): Promise<{ violations: string[]; trace: string[] }> {
  const watch = watchProcess();
  const leases = watchLeases();
  const recorder = new ModelRecorder();
  const tag = randomUUID().slice(0, 8);
  const app = await factory({ store, lockTimeout, recorder, logger: leases.logger });
  const sents: Sent[] = [];
  const finals: Sent[] = [];
  const extra: string[] = [];
  try {
    const pending: Promise<Sent>[] = [];
    for (const [i, step] of steps.entries()) {
      const key = `${tag}-${step.key}`;
      const copies = Array.from({ length: step.copies }, (_, copy) =>
        send(
          app.url,
          step,
          key,
          copy === 0 ? step.leaveAfter : null,
          `#${i}${step.copies > 1 ? `.${copy}` : ''}`,
        ),
      );
      pending.push(...copies);
      if (!step.background) await Promise.all(copies);
    }
    sents.push(...(await Promise.all(pending)));
    // Handlers still running (a response still streaming) hold their key legitimately: wait for them first.
    const deadline = Date.now() + 5_000;
    while (recorder.openCount > 0 && Date.now() < deadline) await later(20);
    for (const run of recorder.inFlight())
      extra.push(
        `[handlers settle] run ${run.id} (${run.user} ${run.route}) still open 5 s after its client was done`,
      );
    const lastOf = new Map<string, ModelStep>();
    for (const step of steps) lastOf.set(`${scopeOf(step.route, step.user)} ${step.key}`, step);
    const last = (step: ModelStep) =>
      send(app.url, { ...step, delay: 0 }, `${tag}-${step.key}`, null, `final ${step.user} ${step.key}`);
    // A last request per key; one answered 409 is asked again once a whole lease has run out, and must not be.
    const first = await Promise.all([...lastOf.values()].map(last));
    const held = first.filter((sent) => sent.answer?.status === 409);
    if (held.length > 0) await later(lockTimeout + 300);
    const again = await Promise.all(held.map((sent) => last(sent.step)));
    finals.push(...first.filter((sent) => !held.includes(sent)), ...again);
    const settle = Date.now() + 5_000;
    while (recorder.openCount > 0 && Date.now() < settle) await later(20);
    await later(20);
  } finally {
    await app.close().catch(() => {});
    watch.stop();
    leases.stop();
  }
  const maxStallMs = leases.maxStallMs();
  return {
    violations: [
      ...extra,
      ...violations(sents, finals, recorder.runs, watch.events, {
        lostKeys: leases.lostKeys,
        maxStallMs,
        lockTimeout,
      }),
    ],
    trace: [
      `event loop stalled at most ${maxStallMs} ms; leases lost: ${leases.lostKeys.length === 0 ? 'none' : leases.lostKeys.join(', ')}`,
      ...[...sents, ...finals].map(describeSent),
      ...recorder.runs.map(
        (run) =>
          `run ${run.id}: ${run.user} ${run.route} key ${run.key.slice(run.key.indexOf('-') + 1)} answered ${run.status ?? '-'}, handed +${(run.handed ?? Number.NaN) - run.start} ms, closed +${(run.closed ?? Number.NaN) - run.start} ms${run.leftEarly ? ', client left first' : ''}`,
      ),
    ],
  };
}

/** The steps of a sequence, as a replayable literal. */
function showSteps(steps: ModelStep[]): string {
  return steps
    .map(
      (s, i) =>
        `  #${i} ${s.user} ${s.route} key ${s.key} amount ${s.amount} delay ${s.delay}${s.copies > 1 ? ` x${s.copies}` : ''}${s.leaveAfter === null ? '' : ` leave@${s.leaveAfter}ms`}${s.background ? ' (background)' : ''}`,
    )
    .join('\n');
}

/**
 * The model test of one adapter on the given stores: a jest test per store, `settings.runs` random sequences from
 * `settings.seed`, shrunk on failure; the failure names the seed and path to replay it with.
 */
export function modelSuite(name: string, factory: ModelAppFactory, stores: ModelStore[]): void {
  const settings = modelSettings();
  describe(`${name}: model`, () => {
    for (const modelStore of stores) {
      afterAll(async () => {
        await modelStore.close?.();
      });
      test(
        `random sequences on ${modelStore.name} keep every invariant`,
        async () => {
          let last: { violations: string[]; trace: string[]; steps: ModelStep[] } | undefined;
          const details = await fc.check(
            fc.asyncProperty(
              fc.array(stepArbitrary(settings.routes), { minLength: 1, maxLength: 10 }),
              async (steps) => {
                const result = await runSequence(factory, modelStore.store(), steps, settings.lockTimeout);
                if (settings.verbose)
                  console.log(
                    [showSteps(steps), ...result.violations, ...result.trace.map((t) => `  ${t}`)].join('\n'),
                  );
                if (result.violations.length > 0) {
                  last = { ...result, steps };
                  return false;
                }
                return true;
              },
            ),
            {
              seed: settings.seed,
              numRuns: settings.runs,
              ...(settings.path === undefined ? {} : { path: settings.path }),
              interruptAfterTimeLimit: settings.timeLimitMs,
              markInterruptAsFailure: false,
            },
          );
          if (!details.failed) return;
          const file = expect.getState().testPath ?? '<this test file>';
          const routes =
            settings.routes === MODEL_ROUTES ? '' : `ONCELY_MODEL_ROUTES=${settings.routes.join(',')} `;
          const replay = `${routes}ONCELY_MODEL_SEED=${details.seed} ONCELY_MODEL_PATH=${details.counterexamplePath ?? ''} npx jest ${file} -t '${name}: model random sequences on ${modelStore.name}'`;
          // `last` is the last failing sequence fast-check tried: the smallest it found.
          const lines = [
            `${name} on ${modelStore.name}: an invariant broke (seed ${details.seed}, path ${details.counterexamplePath}, ${details.numShrinks} shrinks)`,
            `replay: ${replay}`,
            'sequence:',
            last === undefined ? '  (none recorded)' : showSteps(last.steps),
            'broken:',
            ...(last?.violations ?? [String(details.errorInstance)]).map((v) => `  ${v}`),
            'answers:',
            ...(last?.trace ?? []).map((t) => `  ${t}`),
          ];
          throw new Error(lines.join('\n'));
        },
        settings.timeLimitMs + 60_000,
      );
    }
  });
}
