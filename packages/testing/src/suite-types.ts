import type { IncomingHttpHeaders } from 'node:http';
import type { IdempotencyOptions, IdempotencyStore, Logger } from '@oncely/core';

// What an adapter's harness gives the shared suites, in a file of its own so that the suites and their helpers
// import it without importing one another.

/** What the suite's option callbacks may read from a request, whatever the framework. */
export interface TestRequest {
  headers: IncomingHttpHeaders;
}
export type TestAppOptions = IdempotencyOptions<TestRequest>;

/**
 * An app built by an adapter's harness. Every harness serves the same routes, so the suite is one:
 * - `POST|PUT|PATCH|GET|DELETE /charges[?delay=ms]`: counts "charges", answers 201 (GET/DELETE: 200) with
 *   `x-charge-id: n`, `set-cookie: session=n` and JSON `{ id: n, amount: body.amount ?? null }`.
 * - `POST /status/:code[?delay=ms]`: counts "status", answers that status with JSON `{ n }` (204: no body).
 * - `POST /throw[?status=N]`: counts "throw", throws an Error (with `status` N if given); the app's error handler
 *   answers `err.status ?? 500` with JSON `{ error }`.
 * - `POST /reject`: counts "reject", hands an Error to the framework asynchronously (Express: `next(err)`,
 *   Fastify: a rejected async handler); answered 500.
 * - `POST /binary`: counts "binary", sends a Buffer of every byte value (1024 bytes), application/octet-stream.
 * - `POST /stream`: counts "stream", streams 10 chunks of 1000 binary bytes (Express: `res.write`; Fastify: a
 *   Readable payload), application/octet-stream.
 * - `POST /big?size=N`: counts "big", sends N bytes.
 * - `POST /text`: counts "text", sends the string `héllo wörld ✓` as text/plain.
 * - `POST /key`: answers JSON `{ key: req.idempotencyKey ?? null }`.
 */
export interface TestApp {
  /** Base URL of the listening server. */
  url: string;
  count(route: string): number;
  close(): Promise<void>;
}

export interface AdapterHarness {
  name: string;
  create(options: TestAppOptions): Promise<TestApp>;
  /** The store its apps get when a test gives none (set by `onStore`); a MemoryStore of their own otherwise. */
  store?(): IdempotencyStore;
  /** Apps where a second registration covers `POST /charges` nearer the route than the app-wide one. */
  nested: NestedHarness;
  /** Cases of the shared suite this adapter does not pass yet, each with the reason: skipped for it alone. */
  knownGaps?: Partial<Record<KnownGap, string>>;
}

/** The shared cases an adapter may name in `knownGaps`. */
export type KnownGap = 'reused-buffer';

export interface NestedHarness {
  /**
   * What the adapter does when the two registrations set different options: the one nearest the route handles
   * the request (`'nearest'`), or the request is refused with a 500 (`'refused'`).
   */
  rule: 'nearest' | 'refused';
  /**
   * The suite's routes with `outer` registered as `create` registers its options, and `POST /charges` covered
   * again by a registration of `inner` nearer the route: a route-level middleware, a Fastify child context, the
   * handler wrapped a second time, `@Idempotent(inner)`.
   */
  create(outer: TestAppOptions, inner: TestAppOptions): Promise<TestApp>;
}

/** Records log calls, to prove that something was logged. */
export function recordingLogger(): Logger & {
  lines: { level: string; msg: string | undefined; obj: Record<string, unknown> }[];
} {
  const lines: { level: string; msg: string | undefined; obj: Record<string, unknown> }[] = [];
  const at = (level: string) => (obj: object, msg?: string) =>
    void lines.push({ level, msg, obj: obj as Record<string, unknown> });
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

/** What `httpSuiteOnRedis` needs of a Redis client (ioredis's `Redis` fits). */
export interface RedisClientLike {
  keys(pattern: string): Promise<string[]>;
  del(...keys: string[]): Promise<number>;
  quit(): Promise<unknown>;
}
