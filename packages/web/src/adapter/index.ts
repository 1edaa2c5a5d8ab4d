/**
 * `@oncely/web/adapter`: the fetch-model core that @oncely/hono builds on (asking the engine about a `Request`,
 * storing the `Response`), for adapters of web-standard frameworks. An app imports from `@oncely/web`.
 *
 * @module @oncely/web/adapter
 */
export {
  HandlerFailure,
  KnownBody,
  registrationMade,
  respondOnce,
  toResponse,
  type WebExchange,
} from '../respond';
