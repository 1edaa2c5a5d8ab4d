/**
 * `@oncely/core/node`: what the Node adapters (Express, Fastify, Koa) share to capture a response, kept out of the
 * main entry so that edge runtimes (`@oncely/web`, Hono) load nothing of Node's.
 *
 * @module @oncely/core/node
 */
export {
  type BodyChunk,
  closedByClient,
  type NodeResponseHead,
  ResponseCapture,
  toChunk,
} from './capture';
