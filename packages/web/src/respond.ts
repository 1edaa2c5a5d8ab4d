import { AsyncLocalStorage } from 'node:async_hooks';
import type { Idempotency, IdempotencyContext, Logger, StoredResponse } from '@oncely/core';
import { InvalidValueError } from '@oncely/core';
import {
  conflictingOptions,
  type Execution,
  type LeaseSettings,
  type Registration,
  refuseNested,
} from '@oncely/core/adapter';

/** What `respondOnce` needs to know about one request. */
export interface WebExchange<Req> {
  /** The request: its method, URL, headers and (unless `readBody` is given) body. */
  request: Request;
  /** What `scope` and `fingerprint` receive: the `Request` itself, Hono's `Context`. */
  target: Req;
  /**
   * The body for the fingerprint, leaving it readable by the handler: its bytes, or its text when `json` is true.
   * Default: a clone's bytes.
   */
  readBody?: (json: boolean) => Promise<ArrayBuffer | string>;
  /** Where this request's log lines go. Default: the `logger` option. */
  log?: Logger;
  /**
   * The request's headers as a record with lower-case names, when the platform already holds them so (Node's
   * `IncomingMessage.headers` under @hono/node-server): read instead of `request.headers`, which there builds an
   * undici `Headers` on first use, and which the engine would copy into a record again.
   */
  headers?: Readonly<Record<string, string | string[] | undefined>>;
  /**
   * Whether the client has gone (asked once the store has answered). Default: `request.signal.aborted`. Hono on
   * @hono/node-server reads Node's response instead, which costs no `AbortController`.
   */
  clientGone?: (target: Req) => boolean;
  /**
   * Makes the `Response` of a replay or a problem answer from what the engine gives. Default: `toResponse`. Hono's
   * adds the headers its middleware prepared before oncely (a request id, a session cookie).
   */
  respond?: (answer: StoredResponse, target: Req) => Response;
  /**
   * The registration handling the request (`engine` is its engine, or its options over an outer one's), so that
   * another one the same request meets nearer the handler (a handler wrapped twice, Hono's middleware in front of
   * a wrapped handler) can tell whether it may leave the request to this one. Without it, no such check is made.
   */
  registration?: Registration<Req>;
  /** This request's lease settings (a Lambda invocation's deadline), over the `lockTimeout` option. */
  lease?: LeaseSettings;
}

/** The registration that took a request, as a nested one meets it (`holding`). */
interface Holder {
  readonly registration: Registration<never>;
  /** The engine it handles the request with. */
  readonly engine: Idempotency<never>;
  /** The request it took, and the value of its key header there. */
  readonly request: Request;
  readonly key: string | undefined;
  /** What its handler gets: a nested registration that leaves the request to it gives its handler the same. */
  readonly context: IdempotencyContext;
  /** Set by a registration nearer the handler that refused the request: the holder releases its key. */
  refused: Error | undefined;
}

/**
 * The registration running a handler, for the whole of its run (`holding`): a nested one meets it even when the
 * Request was rebuilt on the way (new Request(request), a router, a Workers middleware). Shared by every copy of
 * this package (and so by @oncely/hono, which goes through respondOnce).
 */
interface Nesting {
  readonly holding: AsyncLocalStorage<Holder>;
  /**
   * How many registrations go through respondOnce. With one, no request can meet two, and no run is tracked: on
   * Node 20 and 22 the first AsyncLocalStorage run turns on a hook every promise of the process pays for.
   */
  made: number;
}
const kNesting = Symbol.for('oncely.web.nesting');
const globalNesting = globalThis as typeof globalThis & { [kNesting]?: Nesting };
globalNesting[kNesting] ??= { holding: new AsyncLocalStorage<Holder>(), made: 0 };
const nesting = globalNesting[kNesting];

/** Counts a registration that hands its requests to respondOnce (`withIdempotency`, @oncely/hono's middleware). */
export function registrationMade(): void {
  nesting.made++;
}

/** What `run` returns when the handler failed but the framework already turned the error into a response. */
export class HandlerFailure {
  /** Pairs the handler's error with the response the framework made of it. */
  constructor(
    /** The handler's error: the key is released, so a retry runs again. */
    readonly error: unknown,
    /** The response the framework made of it, sent as it is. */
    readonly response: Response,
  ) {}
}

/**
 * What `run` returns when the adapter already knows the bytes of the response's body (Hono's `c.json(...)` gave
 * them): they are stored as they are, and the response goes out untouched, its body stream never read.
 */
export class KnownBody {
  /** Pairs the response with the bytes of its body. */
  constructor(
    /** The response, sent untouched. */
    readonly response: Response,
    /** The bytes of the response's body, which are stored. */
    readonly body: Uint8Array,
  ) {}
}

/**
 * The shared core of the web-standard adapters (`@oncely/web`, `@oncely/hono`): asks the engine about the request,
 * and either answers (a replay, a problem) without calling `run`, or calls `run` and stores the `Response` it
 * returns before returning one with the same bytes. `run` gets the key's context when the request is covered, and
 * `undefined` when it passes through untouched. All policy stays in the engine.
 */
export async function respondOnce<Req>(
  engine: Idempotency<Req>,
  exchange: WebExchange<Req>,
  run: (context: IdempotencyContext | undefined) => Promise<Response | HandlerFailure | KnownBody>,
): Promise<Response> {
  const { request, log, headers } = exchange;
  const o = engine.options;
  // Cheap exits first, before any header copy or body read: most requests are not ours.
  const hasKey = headers === undefined ? request.headers.has(o.header) : headers[o.header] !== undefined;
  if (engine.passes(request.method, hasKey)) return settledResponse(await run(undefined));
  const taken =
    exchange.registration === undefined || nesting.made < 2 ? undefined : nesting.holding.getStore();
  if (taken !== undefined && exchange.registration !== undefined && sameRequest(taken, request, headers)) {
    // Another registration took the request first (this one wraps the handler it runs). Nothing outside it tells
    // the outer one about this one: if this one sets an option that would handle the request otherwise, neither
    // may apply, and it is refused with a 500 naming both; the outer one then releases its key.
    const names =
      taken.registration === exchange.registration
        ? []
        : conflictingOptions(taken.engine.options, exchange.registration);
    if (names.length === 0) return settledResponse(await run(taken.context));
    const refusal = refuseNested(taken.registration, exchange.registration as Registration<never>, names);
    taken.refused ??= refusal.error;
    return exchange.respond === undefined
      ? toResponse(refusal.response)
      : exchange.respond(refusal.response, exchange.target);
  }
  let body: unknown;
  // With a readBody of its own, the adapter reads the body; `request.body` is not touched, since on
  // @hono/node-server reading it builds a full undici Request and its streams, a large part of a request's cost.
  if (o.fingerprint === undefined && (exchange.readBody !== undefined || request.body !== null)) {
    try {
      const type = headers === undefined ? request.headers.get('content-type') : headers['content-type'];
      body = await readBody(request, typeof type === 'string' ? type : null, exchange.readBody);
    } catch (error) {
      return toResponse(engine.unreadableBody(error, log));
    }
  }
  const decision = await engine.handle(
    {
      method: request.method,
      url: pathAndQuery(request.url),
      headers: headers ?? Object.fromEntries(request.headers),
      body,
      request: exchange.target,
      lease: exchange.lease,
    },
    log,
  );
  if (decision.action === 'pass') return settledResponse(await run(undefined));
  if (decision.action === 'respond')
    return exchange.respond === undefined
      ? toResponse(decision.response)
      : exchange.respond(decision.response, exchange.target);
  const { execution } = decision;
  let gone = false;
  try {
    gone =
      exchange.clientGone === undefined
        ? request.signal?.aborted === true
        : exchange.clientGone(exchange.target);
  } catch {
    // A platform's getter that throws says nothing about the client: the handler runs, as it did before the check.
  }
  // The client left while the store was asked: the handler does not run for nobody (the engine's answer goes
  // nowhere), and the key is released, so the client's retry runs it.
  if (gone) return toResponse(await execution.clientGone());
  const context: IdempotencyContext = execution.context;
  let holder: Holder | undefined;
  if (exchange.registration !== undefined && nesting.made > 1) {
    holder = {
      registration: exchange.registration as Registration<never>,
      engine: engine as Idempotency<never>,
      request,
      key: headerValue(headers === undefined ? request.headers.get(o.header) : headers[o.header]),
      context,
      refused: undefined,
    };
  }
  let response: Response | HandlerFailure | KnownBody;
  try {
    // Inside the execution's context: currentIdempotency() answers in the handler (web) or the middlewares after
    // this one (Hono), after any await.
    response = await execution.run(() =>
      holder === undefined ? run(context) : nesting.holding.run(holder, run, context),
    );
    if (holder?.refused !== undefined) {
      // A registration nearer the handler refused it: that answer is sent, and nothing is stored.
      await execution.fail(holder.refused);
      return settledResponse(response);
    }
    if (response instanceof HandlerFailure) {
      await execution.fail(response.error);
      return response.response;
    }
    if (response instanceof KnownBody) {
      const { body } = response;
      const replacement = await execution.complete({
        status: response.response.status,
        headers: headerRecord(response.response.headers),
        body: body.byteLength <= execution.maxBodyBytes ? body : undefined,
      });
      return replacement === undefined ? response.response : toResponse(replacement);
    }
    if (!isResponse(response)) {
      throw new InvalidValueError(
        `oncely: the handler must return a Response; it returned ${response === null ? 'null' : typeof response}`,
      );
    }
  } catch (error) {
    await execution.fail(error);
    throw error;
  }
  try {
    return await capture(execution, response);
  } catch (error) {
    // Reading the response threw before it was settled (a body or headers getter, a Response that refuses its own
    // status): as if the handler had thrown, so its key is not left locked. Does nothing once it is settled.
    await execution.fail(error);
    throw error;
  }
}

/**
 * Whether a request met inside the holder's run is the one it took: the same Request, or one rebuilt from it that
 * carries the same key. A request with another key (or none) that its handler sends on is an operation of its own.
 */
function sameRequest(
  holder: Holder,
  request: Request,
  headers: Readonly<Record<string, string | string[] | undefined>> | undefined,
): boolean {
  if (holder.request === request) return true;
  const name = holder.engine.options.header;
  const key = headerValue(headers === undefined ? request.headers.get(name) : headers[name]);
  return key !== undefined && key === holder.key;
}

/** A header's value as `Headers.get` gives it: repeated values joined with ", ". */
function headerValue(value: string | string[] | null | undefined): string | undefined {
  if (value === null || value === undefined) return undefined;
  return typeof value === 'string' ? value : value.join(', ');
}

/**
 * Stores the handler's response (or releases the key) and gives back one with the same bytes to send. Not the Node
 * adapters' `ResponseCapture` (`@oncely/core/node`): a fetch handler hands back a finished `Response` whose body is
 * a web stream, read here with its reader and answered with a new `Response`, on runtimes without Node's buffers or
 * streams. The decisions at each early end are the same ones.
 */
async function capture(execution: Execution, response: Response): Promise<Response> {
  const headers = headerRecord(response.headers);
  const init = { status: response.status, statusText: response.statusText, headers: response.headers };
  if (response.body === null) {
    const replacement = await execution.complete({ status: response.status, headers, body: EMPTY });
    return replacement === undefined ? new Response(null, init) : toResponse(replacement);
  }
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.byteLength;
      if (size > execution.bufferLimit) {
        // Too big to keep: what was read and the rest stream through, and the end of the stream records the
        // request as executed (a retry gets a 410, never a second run).
        return new Response(continuation(execution, chunks, reader, response.status, headers), init);
      }
    }
  } catch (error) {
    // The body failed before any of it reached the client: as if the handler had thrown.
    await execution.fail(error);
    throw error;
  }
  const bytes = concat(chunks, size);
  const replacement = await execution.complete({
    status: response.status,
    headers,
    body: size <= execution.maxBodyBytes ? bytes : undefined,
  });
  return replacement === undefined ? new Response(bytes, init) : toResponse(replacement);
}

function continuation(
  execution: Execution,
  held: Uint8Array[],
  reader: ReadableStreamDefaultReader<Uint8Array>,
  status: number,
  headers: Record<string, string | string[]>,
): ReadableStream<Uint8Array> {
  let settled = false;
  // At the stream's end, or (early) when it is cancelled or dropped unread: the engine records either as executed
  // without a body. A stream that fails is a failed handler: the key is released.
  const settle = (how: 'complete' | 'early' | { error: unknown }) => {
    if (settled) return;
    settled = true;
    abandoned?.unregister(execution);
    if (how === 'complete') void execution.complete({ status, headers, body: undefined });
    else if (how === 'early') void execution.endedEarly(status, headers);
    else void execution.fail(how.error);
  };
  const executed = () => settle('early');
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = held.shift();
      if (next !== undefined) return controller.enqueue(next);
      try {
        const { done, value } = await reader.read();
        if (done) {
          settle('complete');
          controller.close();
        } else controller.enqueue(value);
      } catch (error) {
        settle({ error });
        controller.error(error);
      }
    },
    cancel(reason) {
      // The client went away mid-body: same as above, and stop producing the rest.
      executed();
      return reader.cancel(reason);
    },
  });
  // A Response dropped unread (a wrapper that replaced it) ends neither way, and the lease would be renewed for as
  // long as the process lives: once its body is collected, the request is recorded as executed all the same.
  abandoned?.register(body, executed, execution);
  return body;
}

// Where the runtime has one (Node, Bun, Deno); elsewhere an unread body keeps its key until the process ends.
const abandoned =
  typeof FinalizationRegistry === 'function'
    ? new FinalizationRegistry<() => void>((executed) => executed())
    : undefined;

const EMPTY = new Uint8Array(0);
const JSON_TYPE = /^application\/(?:[\w.+-]*\+)?json\s*(?:;|$)/i;

/**
 * The body as the fingerprint should see it. JSON is parsed, so that key order does not matter and the record
 * matches one made by the Express or Fastify adapter (which hash the parsed body) for the same request; anything
 * else, or JSON that does not parse, is hashed as its bytes. By default read from a clone, so the handler reads the original.
 */
async function readBody(
  request: Request,
  type: string | null,
  read: ((json: boolean) => Promise<ArrayBuffer | string>) | undefined,
): Promise<unknown> {
  const json = type !== null && JSON_TYPE.test(type);
  const data = read === undefined ? await request.clone().arrayBuffer() : await read(json);
  // A string is hashed as its UTF-8 bytes, as the same bytes would be.
  const body = typeof data === 'string' ? data : new Uint8Array(data);
  if ((typeof body === 'string' ? body.length : body.byteLength) === 0) return undefined;
  if (!json) return body;
  try {
    return JSON.parse(typeof body === 'string' ? body : new TextDecoder().decode(body));
  } catch {
    return body;
  }
}

/** `https://host/a/b?c=1` → `/a/b?c=1`, without a URL object per request. */
function pathAndQuery(url: string): string {
  const scheme = url.indexOf('://');
  if (scheme === -1) return url;
  const path = url.indexOf('/', scheme + 3);
  if (path === -1) return '/';
  const hash = url.indexOf('#', path);
  return hash === -1 ? url.slice(path) : url.slice(path, hash);
}

function headerRecord(headers: Headers): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  // Iteration gives lower-case names and joins repeated ones, except Set-Cookie, which comes once per cookie.
  for (const [name, value] of headers) {
    const seen = out[name];
    out[name] = seen === undefined ? value : Array.isArray(seen) ? [...seen, value] : [seen, value];
  }
  return out;
}

// Statuses whose Response may not have a body (the constructor throws).
const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/** A stored response, or one of the engine's problem answers, as a `Response`. */
export function toResponse(stored: StoredResponse): Response {
  const body = NULL_BODY.has(stored.status) ? null : stored.body;
  let repeated = false;
  for (const name in stored.headers) if (Array.isArray(stored.headers[name])) repeated = true;
  // A plain object when every header has one value (nearly always): @hono/node-server writes those straight to
  // Node's response; a Headers object it converts first.
  if (!repeated)
    return new Response(body, { status: stored.status, headers: stored.headers as Record<string, string> });
  const headers = new Headers();
  for (const name in stored.headers) {
    const value = stored.headers[name];
    if (Array.isArray(value)) for (const item of value) headers.append(name, item);
    else if (value !== undefined) headers.set(name, value as string);
  }
  return new Response(body, { status: stored.status, headers });
}

function settledResponse(result: Response | HandlerFailure | KnownBody): Response {
  return result instanceof HandlerFailure || result instanceof KnownBody ? result.response : result;
}

function isResponse(value: unknown): value is Response {
  // Not instanceof: a Response from another realm or polyfill is still one.
  return (
    value instanceof Response ||
    (typeof value === 'object' &&
      value !== null &&
      typeof (value as Response).status === 'number' &&
      typeof (value as Response).headers?.get === 'function' &&
      'body' in value)
  );
}

function concat(chunks: readonly Uint8Array[], size: number): Uint8Array {
  if (chunks.length === 1) return chunks[0] as Uint8Array;
  const out = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return out;
}
