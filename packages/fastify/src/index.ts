/**
 * Idempotency-Key plugin for Fastify 5: register `idempotencyPlugin` and mark routes with `config.idempotency`, so a
 * retried request takes effect once and its retries get the first response.
 *
 * @module @oncely/fastify
 */
import { PassThrough, Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import {
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  InvalidValueError,
  type StoredResponse,
} from '@oncely/core';
import { type Execution, nestedEngine, registrationOf } from '@oncely/core/adapter';
import { ResponseCapture } from '@oncely/core/node';
import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onErrorHookHandler,
  onSendHookHandler,
  preHandlerHookHandler,
} from 'fastify';
import fp from 'fastify-plugin';

/** Route-level options: any shared option (docs/options.md) overrides the plugin's for that route. */
export interface IdempotencyRouteOptions extends IdempotencyOptions<FastifyRequest> {}

/**
 * What a route's `config.idempotency` takes: options over the plugin's, `true` for the plugin's, `false` to opt
 * out. Fastify types a route's `config` as what its literal holds, so a misspelt option compiles (and throws when
 * the route is added); `{ ... } satisfies IdempotencyRouteConfig` has the compiler check the literal.
 */
export type IdempotencyRouteConfig = IdempotencyRouteOptions | boolean;

/** The scope the docs recommend for API keys: a keyed hash of a credential header (`@oncely/core`'s, re-exported). */
export { type ScopeByHeaderOptions, scopeByHeader } from '@oncely/core';

export interface FastifyIdempotencyOptions extends IdempotencyRouteOptions {
  /**
   * Cover every route whose method is covered (`true`), or only routes whose `config.idempotency` is set
   * (`false`). A route opts out with `config: { idempotency: false }` either way. Default: `true`.
   */
  global?: boolean;
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * oncely for this route: options over the plugin's, `true` for the plugin's, `false` to opt out. Write
     * `{ ttl: '1h' } satisfies IdempotencyRouteConfig` to have a misspelt option caught at compile time.
     */
    idempotency?: IdempotencyRouteConfig;
  }
  interface FastifyRequest {
    /** The Idempotency-Key this request runs under (unquoted), set while oncely covers the request. */
    idempotencyKey: string | undefined;
    /** The key and, in transactional mode, the transaction's database client; set while oncely covers the request. */
    idempotency: IdempotencyContext | undefined;
  }
}

const kState = Symbol.for('oncely.fastify.state');

interface RequestState {
  /**
   * The capture while onSend is not settling it: onSend takes it out of here first, synchronously, and puts it
   * back only while a body too large to store streams to the client. Once it has decided, nothing settles it.
   */
  capture: ResponseCapture | undefined;
  /** An error Fastify routed for this request (seen by onError): the key is released whatever the answer. */
  error: unknown;
}
type StatefulRequest = FastifyRequest & { [kState]: RequestState | null };

const PLUGIN_OPTIONS = new Set(['global']);

/**
 * What the registration nearest a route so far decided for it, by route options object (onRoute hooks see each
 * route in every registration's context, the outermost first): the engine its options make there, and the hooks
 * it put on the route, for a registration nearer the route to take off.
 */
interface RouteClaim {
  readonly engine: Idempotency<FastifyRequest>;
  /** The engine that handles a request of this method on the route, if any registration covers it. */
  readonly handling: (method: string) => Idempotency<FastifyRequest> | undefined;
  hooks: { preHandler: unknown; onSend: unknown; onError: unknown } | undefined;
}
const claims = new WeakMap<object, RouteClaim>();
const none = (): undefined => undefined;

async function idempotencyPluginAsync(
  fastify: FastifyInstance,
  options: FastifyIdempotencyOptions,
): Promise<void> {
  const { global = true, ...shared } = options;
  // Options are checked here, once; route options are checked when each route is added.
  const engine = new Idempotency<FastifyRequest>(shared, undefined, PLUGIN_OPTIONS);
  const registration = registrationOf(engine, shared, idempotencyPluginAsync, 'idempotencyPlugin');

  // A second registration (say, in a child context) shares the decorators of the first.
  if (!fastify.hasRequestDecorator(kState)) {
    fastify.decorateRequest('idempotencyKey', undefined);
    fastify.decorateRequest('idempotency', undefined);
    fastify.decorateRequest(kState, null);
  }

  fastify.addHook('onRoute', (route) => {
    // The registration nearest the route that covers it decides for it alone, with its options over the outer
    // ones' (a child context's over the root's; within one context, the one registered last). One that does not
    // cover the route (global: false, narrower methods) leaves it to the outer ones.
    const outer = claims.get(route);
    const layered = outer === undefined ? engine : nestedEngine(outer.engine, registration);
    const outerHandling = outer?.handling ?? none;
    claims.set(route, { engine: layered, handling: outerHandling, hooks: outer?.hooks });
    const config = route.config?.idempotency;
    if (config === false || (config === undefined && !global)) return;
    const routeEngine = typeof config === 'object' && config !== null ? layered.with(config) : layered;
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (!methods.some((method) => routeEngine.covers(method))) return;
    // This registration takes the route: the outer ones' hooks come off, and a method it does not cover stays
    // with the outer registration that covered it.
    if (outer?.hooks !== undefined) {
      const { preHandler, onSend, onError } = outer.hooks;
      route.preHandler = toArray(route.preHandler).filter((hook) => hook !== preHandler);
      route.onSend = toArray(route.onSend).filter((hook) => hook !== onSend);
      route.onError = toArray(route.onError).filter((hook) => hook !== onError);
    }
    const handling = (method: string) => (routeEngine.covers(method) ? routeEngine : outerHandling(method));
    const claim: RouteClaim = { engine: layered, handling, hooks: undefined };
    claims.set(route, claim);

    // Callback style, so that the rest of the route (later hooks, the handler) runs inside `execution.run()`:
    // an async hook's continuation would be scheduled by Fastify, outside the context, and lose currentIdempotency().
    const preHandler: preHandlerHookHandler = function oncelyPreHandler(request, reply, done) {
      decide(request, reply).then(
        (execution) => {
          // Answered here (a replay, a problem): `done` is not called, as Fastify asks of a hook that replies,
          // so nothing runs after it while the answer is still being sent.
          if (execution === null) return;
          if (execution === undefined) done();
          else execution.run(done);
        },
        (error: Error) => done(error ?? new Error('the idempotency check failed')),
      );
    };

    /**
     * The preHandler's work: resolves to the execution the handler runs under, `undefined` when the route goes on
     * without oncely, or `null` when oncely answered.
     */
    const decide = async (
      request: FastifyRequest,
      reply: FastifyReply,
    ): Promise<Execution | undefined | null> => {
      const req = request as StatefulRequest;
      if (req[kState] !== null) return; // another oncely registration already holds this request
      const handler = handling(request.method);
      if (handler === undefined) return;
      const logger = handler.options.logger ?? request.log;
      const decision = await handler.handle(
        { method: request.method, url: request.url, headers: request.headers, body: request.body, request },
        logger,
      );
      if (decision.action === 'pass') return;
      if (reply.sent || responseGone(reply.raw)) {
        // Answered by something else while the store was asked, or the client left (its 'close' came before the
        // listener below exists): free the key if we hold it, so the client's retry runs the route, and skip the
        // handler (a hijacked reply is one Fastify neither handles nor sends), as the Express adapter does.
        if (decision.action === 'execute')
          await (reply.sent
            ? decision.execution.fail(new Error('response already sent'))
            : decision.execution.clientGone());
        if (!reply.sent) reply.hijack();
        return;
      }
      if (decision.action === 'respond') {
        req[kState] = { capture: undefined, error: undefined };
        send(reply, decision.response);
        return null;
      }
      decision.execution.headersBeforeHandler(reply.getHeaders());
      request.idempotencyKey = decision.execution.clientKey;
      request.idempotency = decision.execution.context;
      const state: RequestState = {
        capture: new ResponseCapture(decision.execution, reply.raw),
        error: undefined,
      };
      req[kState] = state;
      // The response can end without passing through onSend (a hijacked reply, a client that went away during
      // a streamed body): its end settles whatever is still unsettled, so no key stays locked.
      // \`on\`, not \`once\`: 'close' is emitted once, and \`once\` would wrap the listener in two more allocations.
      reply.raw.on('close', () => onResponseClose(state, reply));
      return decision.execution;
    };

    const onSend: onSendHookHandler<unknown> = async function oncelyOnSend(request, reply, payload) {
      const state = (request as StatefulRequest)[kState];
      let capture = state?.capture;
      if (state === null || state === undefined || capture === undefined || capture.decided) return payload;
      // From here on this hook settles the capture, on every path.
      state.capture = undefined;
      if (capture.streaming) {
        // A streamed body was handed over, yet another answer comes through (an error response): drop it.
        capture.dropRest();
        capture = new ResponseCapture(capture.execution, reply.raw);
      }
      if (state.error !== undefined) {
        await capture.failed(state.error);
        return payload;
      }
      let read: Held;
      try {
        // Strings and bytes (nearly every reply) are held without a promise; only streams need one.
        read = holdNow(capture, payload) ?? (await holdPayload(reply, capture, payload));
      } catch (error) {
        // Fastify answers with its error handler, whose reply passes here again and finds nothing to settle.
        await capture.failed(error);
        throw error;
      }
      if (read.kind === 'unknown') {
        (handling(request.method)?.options.logger ?? request.log).error(
          { key: capture.execution.key, payloadType: describe(payload) },
          'oncely: cannot read this reply payload; releasing the key instead of storing the response',
        );
        await capture.failed(new Error('the reply payload cannot be read'));
        return payload;
      }
      if (read.kind === 'stream') {
        // Too big to keep: the rest streams through, and the end of the stream settles the capture.
        const body = capture.sendRest(read.rest, reply.statusCode, reply.getHeaders(), read.stop);
        if (responseGone(reply.raw)) {
          // The client left before the answer began, and the response's 'close' has passed: nothing of the stream
          // can be sent. The handler ran: recorded as executed (a retry gets a 410), and the source is not read on.
          capture.cutShort();
          return EMPTY;
        }
        state.capture = capture;
        return body;
      }
      const body = capture.body();
      const replacement = await capture.finished(reply.statusCode, reply.getHeaders(), body);
      if (replacement === undefined) return read.kind === 'empty' ? payload : body;
      // The transaction did not commit: the handler's answer must not reach the client.
      reply.code(replacement.status);
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      for (const name in replacement.headers) reply.header(name, replacement.headers[name]);
      return Buffer.from(replacement.body);
    };

    // Fastify runs onError for an error thrown or rejected by the handler or a later hook, before the error
    // handler's response reaches onSend: noting it there releases the key whatever status that response has.
    const onError: onErrorHookHandler = async function oncelyOnError(request, _reply, error) {
      const state = (request as StatefulRequest)[kState];
      if (state !== null && state.error === undefined) state.error = error;
    };

    route.preHandler = [...toArray(route.preHandler), preHandler];
    route.onSend = [...toArray(route.onSend), onSend];
    route.onError = [...toArray(route.onError), onError];
    claim.hooks = { preHandler, onSend, onError };
  });
}

/**
 * The client is gone: Node's response destroyed, or over HTTP/2 its stream (Http2ServerResponse has no `destroyed`).
 */
function responseGone(raw: FastifyReply['raw']): boolean {
  return raw.destroyed === true || (raw as { stream?: { destroyed?: boolean } }).stream?.destroyed === true;
}

/** The response is over (sent, or its connection gone): settles a capture nothing else will settle. */
function onResponseClose(state: RequestState, reply: FastifyReply): void {
  const capture = state.capture;
  if (capture === undefined || capture.decided) return; // settled, or onSend is settling it
  if (state.error !== undefined) {
    capture
      .failed(state.error)
      .catch((error: unknown) => reply.log.error({ err: error }, 'oncely: settling failed'));
    return;
  }
  // The client went away before the end of a body too large to keep: recorded as executed (a retry gets a 410,
  // never a second run), and the source is not read on.
  if (capture.streaming) capture.cutShort();
  // Answered without onSend: the handler hijacked the reply (or wrote to reply.raw) and sent it itself. It ran,
  // but its body was never seen: recorded as executed, without a body (a retry gets a 410).
  else if (reply.raw.writableFinished || reply.sent) capture.wentAround();
  // Otherwise the client went away while the handler runs: its reply still passes through onSend, which settles.
}

function toArray<T>(value: T | T[] | undefined): T[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}

function send(reply: FastifyReply, response: StoredResponse): FastifyReply {
  reply.code(response.status);
  for (const name in response.headers) reply.header(name, response.headers[name]);
  return reply.send(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

type Held =
  /** Nothing to hold: the payload is sent as it is, and stored as an empty body. */
  | { kind: 'empty' }
  /** The whole body is held: what is sent on is `capture.body()`, the same bytes as stored. */
  | { kind: 'body' }
  /** A stream that outgrew the limit: what is held goes first, then `rest`; `stop` stops reading the source. */
  | { kind: 'stream'; rest: AsyncIterator<unknown>; stop: () => void }
  /** A payload this plugin cannot read. */
  | { kind: 'unknown' };

const EMPTY = Buffer.alloc(0);

/** Holds a payload that needs no waiting (nothing, a string, bytes); `undefined` for anything else. */
function holdNow(capture: ResponseCapture, payload: unknown): Held | undefined {
  if (payload === null || payload === undefined) return { kind: 'empty' };
  // The bytes are sent on: Fastify would otherwise encode a string a second time, and a handler may refill its
  // own buffer (a pool) once it handed it over, while the store is asked before anything is sent.
  if (typeof payload === 'string' || payload instanceof Uint8Array) {
    capture.hold(payload);
    return { kind: 'body' };
  }
  return undefined;
}

/**
 * Holds an onSend payload (string, Buffer, typed array, Node or web stream, web Response, nothing); a stream
 * only up to the limit.
 */
async function holdPayload(reply: FastifyReply, capture: ResponseCapture, payload: unknown): Promise<Held> {
  if (isWebResponse(payload)) {
    // Fastify applies a Response's status and headers only after onSend: apply them now, so they are recorded.
    if (payload.body !== null && payload.bodyUsed)
      throw new InvalidValueError('The Response body has already been read');
    reply.code(payload.status);
    for (const [name, value] of payload.headers) reply.header(name, value);
    payload = payload.body;
  }
  const now = holdNow(capture, payload);
  if (now !== undefined) return now;
  const source = toNodeReadable(payload);
  if (source === undefined) return { kind: 'unknown' };
  const rest = await capture.holdStream(source[Symbol.asyncIterator]());
  if (rest !== undefined) return { kind: 'stream', rest, stop: () => source.destroy() };
  return { kind: 'body' };
}

/** A Node Readable to read the payload through, or undefined when it is no stream. */
function toNodeReadable(payload: unknown): Readable | undefined {
  if (typeof payload !== 'object' || payload === null) return undefined;
  if (payload instanceof Readable && typeof payload[Symbol.asyncIterator] === 'function') return payload;
  const candidate = payload as Partial<NodeJS.ReadableStream & { destroy(error?: Error): void }>;
  if (typeof candidate.pipe === 'function') {
    // A stream from another implementation (readable-stream 2, duplexify, pumpify...), which may not be async
    // iterable: read it through a PassThrough, passing its errors on and destroying it with the PassThrough.
    const through = new PassThrough();
    candidate.on?.('error', (error: Error) => through.destroy(error));
    through.once('close', () => {
      if (!through.readableEnded) candidate.destroy?.();
    });
    candidate.pipe(through);
    return through;
  }
  if (typeof (payload as ReadableStream).getReader === 'function') {
    return Readable.fromWeb(payload as WebReadableStream);
  }
  return undefined;
}

function isWebResponse(payload: unknown): payload is Response {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    ((typeof Response === 'function' && payload instanceof Response) ||
      Object.prototype.toString.call(payload) === '[object Response]')
  );
}

function describe(payload: unknown): string {
  if (typeof payload !== 'object' || payload === null) return typeof payload;
  return (payload as object).constructor?.name ?? 'object';
}

/**
 * Tells oncely that the handler of a covered request failed although Fastify's onError did not see it, for
 * frameworks that turn a handler's error into a reply themselves (NestJS's exception filters): the key is released
 * when that reply is sent, instead of the reply being stored. Returns whether oncely covers `request`.
 */
export function noteHandlerError(request: FastifyRequest, error: unknown): boolean {
  const state = (request as StatefulRequest)[kState];
  // Not covered, or answered by oncely itself (a replay, a problem), or settled already.
  if (state === null || state === undefined || state.capture === undefined || state.capture.decided)
    return false;
  // An `undefined` thrown would not read as an error: note one.
  if (state.error === undefined) state.error = error ?? new Error('the handler failed');
  return true;
}

/**
 * Tells oncely that the framework gave up the handler of a covered request before it settled (NestJS unsubscribes
 * from it when the client leaves or a timeout interceptor fires) while it may still be running: the key is not
 * released, so no retry runs beside it; its lease lapses after `lockTimeout` (see `Execution.abandon`). Returns
 * whether oncely covers `request`.
 */
export function noteHandlerAbandoned(request: FastifyRequest): boolean {
  const state = (request as StatefulRequest)[kState];
  if (state === null || state === undefined || state.capture === undefined || state.capture.decided)
    return false;
  state.capture.execution.abandon();
  return true;
}

/**
 * The Fastify 5 plugin: `fastify.register(idempotencyPlugin, options)`. Covers every POST/PUT/PATCH route added
 * after it (or, with `global: false`, only routes with `config.idempotency`); hooks go on covered routes only,
 * so other routes pay nothing.
 */
export const idempotencyPlugin = fp(idempotencyPluginAsync, { fastify: '5.x', name: '@oncely/fastify' });
export default idempotencyPlugin;
