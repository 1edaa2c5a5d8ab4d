import { Readable } from 'node:stream';
import {
  type Execution,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type StoredResponse,
} from '@oncely/core';
import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onErrorHookHandler,
  onSendHookHandler,
  preHandlerHookHandler,
} from 'fastify';
import fp from 'fastify-plugin';

/** Route-level options: any shared option (contract §2) overrides the plugin's for that route. */
export type IdempotencyRouteOptions = IdempotencyOptions<FastifyRequest>;

export interface FastifyIdempotencyOptions extends IdempotencyRouteOptions {
  /**
   * Cover every route whose method is covered (`true`), or only routes whose `config.idempotency` is set
   * (`false`). A route opts out with `config: { idempotency: false }` either way. Default: `true`.
   */
  global?: boolean;
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** oncely for this route: options over the plugin's, `true` for the plugin's, `false` to opt out. */
    idempotency?: IdempotencyRouteOptions | boolean;
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
  execution: Execution | undefined;
  error: unknown;
}
type StatefulRequest = FastifyRequest & { [kState]: RequestState | null };

const PLUGIN_OPTIONS = new Set(['global']);

async function idempotencyPluginAsync(
  fastify: FastifyInstance,
  options: FastifyIdempotencyOptions,
): Promise<void> {
  const { global = true, ...shared } = options;
  // Options are checked here, once; route options are checked when each route is added.
  const engine = new Idempotency<FastifyRequest>(shared, undefined, PLUGIN_OPTIONS);

  // A second registration (say, in a child context) shares the decorators of the first.
  if (!fastify.hasRequestDecorator(kState)) {
    fastify.decorateRequest('idempotencyKey', undefined);
    fastify.decorateRequest('idempotency', undefined);
    fastify.decorateRequest(kState, null);
  }

  fastify.addHook('onRoute', (route) => {
    const config = route.config?.idempotency;
    if (config === false || (config === undefined && !global)) return;
    const routeEngine = typeof config === 'object' && config !== null ? engine.with(config) : engine;
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (!methods.some((method) => routeEngine.covers(method))) return;

    const preHandler: preHandlerHookHandler = async function oncelyPreHandler(request, reply) {
      const req = request as StatefulRequest;
      if (req[kState] !== null) return; // another oncely registration already holds this request
      const decision = await routeEngine.handle(
        { method: request.method, url: request.url, headers: request.headers, body: request.body, request },
        routeEngine.options.logger ?? request.log,
      );
      if (decision.action === 'pass') return;
      if (decision.action === 'respond') {
        req[kState] = { execution: undefined, error: undefined };
        return send(reply, decision.response);
      }
      request.idempotencyKey = decision.execution.clientKey;
      request.idempotency = { key: decision.execution.clientKey, db: decision.execution.db };
      req[kState] = { execution: decision.execution, error: undefined };
    };

    const onSend: onSendHookHandler<unknown> = async function oncelyOnSend(request, reply, payload) {
      const state = (request as StatefulRequest)[kState];
      const execution = state?.execution;
      if (state === null || execution === undefined) return payload;
      state.execution = undefined;
      if (state.error !== undefined) {
        await execution.fail(state.error);
        return payload;
      }
      const { body, payload: out } = await collect(payload, execution.bufferLimit);
      const stored = body !== undefined && body.byteLength <= execution.maxBodyBytes ? body : undefined;
      const replacement = await execution.complete({
        status: reply.statusCode,
        headers: reply.getHeaders(),
        body: stored,
      });
      if (replacement === undefined) return out;
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
  });
}

function toArray<T>(value: T | T[] | undefined): T[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}

function send(reply: FastifyReply, response: StoredResponse): FastifyReply {
  reply.code(response.status);
  for (const name in response.headers) reply.header(name, response.headers[name]);
  return reply.send(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

interface Collected {
  /** The bytes to store, or undefined when they outgrew the limit. */
  body: Uint8Array | undefined;
  /** What to send on: the same bytes, or a stream that replays what was read and then the rest. */
  payload: unknown;
}

const EMPTY = Buffer.alloc(0);

/** Reads an onSend payload (string, Buffer, typed array, Node or web stream, nothing) into bytes, up to `limit`. */
async function collect(payload: unknown, limit: number): Promise<Collected> {
  if (payload === null || payload === undefined) return { body: EMPTY, payload };
  if (typeof payload === 'string') {
    const body = Buffer.from(payload);
    return { body: body.byteLength > limit ? undefined : body, payload };
  }
  if (payload instanceof Uint8Array) {
    return { body: payload.byteLength > limit ? undefined : payload, payload };
  }
  let source: AsyncIterator<unknown> | undefined;
  if (payload instanceof Readable || typeof (payload as Readable).pipe === 'function') {
    source = (payload as Readable)[Symbol.asyncIterator]();
  } else if (typeof (payload as ReadableStream).getReader === 'function') {
    source = Readable.fromWeb(payload as import('node:stream/web').ReadableStream)[Symbol.asyncIterator]();
  }
  if (source === undefined) return { body: undefined, payload };
  const chunks: Buffer[] = [];
  let size = 0;
  for (;;) {
    const { value, done } = await source.next();
    if (done) {
      const body = Buffer.concat(chunks, size);
      return { body, payload: body };
    }
    const chunk = typeof value === 'string' ? Buffer.from(value) : Buffer.from(value as Uint8Array);
    chunks.push(chunk);
    size += chunk.byteLength;
    if (size > limit) {
      // Too big to keep: send what was read, then the rest of the stream, untouched.
      const rest = source;
      const replay = async function* () {
        yield* chunks;
        for (;;) {
          const next = await rest.next();
          if (next.done) return;
          yield next.value;
        }
      };
      return { body: undefined, payload: Readable.from(replay(), { objectMode: false }) };
    }
  }
}

/**
 * The Fastify 5 plugin: `fastify.register(idempotencyPlugin, options)`. Covers every POST/PUT/PATCH route added
 * after it (or, with `global: false`, only routes with `config.idempotency`); hooks go on covered routes only,
 * so other routes pay nothing.
 */
export const idempotencyPlugin = fp(idempotencyPluginAsync, { fastify: '5.x', name: '@oncely/fastify' });
export default idempotencyPlugin;
