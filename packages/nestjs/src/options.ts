import type { IncomingHttpHeaders } from 'node:http';
import type { FactoryProvider, ModuleMetadata } from '@nestjs/common';
import { Idempotency, type IdempotencyOptions, IdempotencyOptionsError } from '@oncely/core';

/**
 * What `scope` and `fingerprint` receive: the platform's request (an Express `Request` on
 * `@nestjs/platform-express`, a `FastifyRequest` on `@nestjs/platform-fastify`), typed by the fields both have.
 * Narrow it in the callback when you need more (`(req as Request).user`).
 */
export interface IdempotentRequest {
  /** The request method. */
  method: string;
  /** Path and query as the client sent them. */
  url: string;
  /** Request headers with lower-case names. */
  headers: IncomingHttpHeaders;
  /** The parsed body, or `undefined` when there is none or no parser ran. */
  body?: unknown;
}

/** The shared options (docs/options.md), for the module and for `@Idempotent(options)` on a controller or handler. */
export type IdempotentOptions = IdempotencyOptions<IdempotentRequest>;

/** Options of `IdempotencyModule.forRoot()`: the shared options, and `global`. */
export interface IdempotencyModuleOptions extends IdempotentOptions {
  /**
   * Cover every route whose method is covered (`methods`, by default POST, PUT and PATCH) (`true`), or only the
   * controllers and handlers marked `@Idempotent()` (`false`). `@Idempotent(false)` opts one out either way.
   * Default: `false`.
   */
  global?: boolean;
}

/** Options of `IdempotencyModule.forRootAsync()`: a factory Nest calls with the providers named in `inject`. */
export interface IdempotencyModuleAsyncOptions {
  /** Modules whose exported providers the factory needs (`ConfigModule`). */
  imports?: ModuleMetadata['imports'];
  /** Providers passed to `useFactory`, in order. */
  inject?: FactoryProvider['inject'];
  /** Makes the module's options from the `inject` providers; may be async. */
  useFactory: (...args: never[]) => IdempotencyModuleOptions | Promise<IdempotencyModuleOptions>;
}

/** The module's options once checked. */
export interface ModuleConfig {
  global: boolean;
  /**
   * The shared options with the store filled in: a route with options of its own gets an engine of its own, and
   * must still find the records of the others (a key reused on another path is a 422, not a second record).
   */
  shared: IdempotentOptions;
  /** The module's engine, against which a route's options are checked. */
  engine: Idempotency<IdempotentRequest>;
}

const MODULE_OPTIONS = new Set(['global']);

/** Checks the module's options once, when Nest creates the module: every mistake names the option. */
export function resolveModuleOptions(options: IdempotencyModuleOptions | undefined): ModuleConfig {
  // Only forRootAsync's factory can give anything else (forRoot defaults to {}): a factory that forgot its
  // `return` would otherwise start with a MemoryStore of this process's own, without a word.
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new IdempotencyOptionsError(
      'useFactory',
      `must return the options object (or {}); it returned ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}. An arrow function with a block body needs its \`return\`, or write useFactory: (config) => ({ store: ... }).`,
    );
  }
  const given = options;
  const engine = new Idempotency<IdempotentRequest>(given, undefined, MODULE_OPTIONS);
  const { global = false, ...shared } = given;
  if (typeof global !== 'boolean') {
    throw new IdempotencyOptionsError('global', `must be true or false; got ${JSON.stringify(global)}.`);
  }
  return { global, shared: { ...shared, store: engine.options.store }, engine };
}

/** Checks a route's `@Idempotent(options)` against the module's, naming the handler in the error. */
export function checkRouteOptions(config: ModuleConfig, options: IdempotentOptions, where: string): void {
  try {
    config.engine.with(options);
  } catch (error) {
    if (error instanceof Error) error.message = `${error.message} (in @Idempotent() on ${where})`;
    throw error;
  }
}
