import { Inject, Injectable, type Type } from '@nestjs/common';
import { DiscoveryService, HttpAdapterHost, MetadataScanner } from '@nestjs/core';
import { IdempotencySetupError } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin, noteHandlerError } from '@oncely/fastify';
import type { RequestHandler } from 'express';
import type { FastifyInstance } from 'fastify';
import { IDEMPOTENT_METADATA, type IdempotentSetting } from './decorators';
import { enteredRequests } from './entered';
import { checkRouteOptions, type IdempotentOptions, type ModuleConfig } from './options';
import { IDEMPOTENCY_CONFIG } from './tokens';

// Nest's own metadata keys, written out: '@nestjs/common/constants' has no `exports` map, so an ES module
// cannot import it by that name.
/** `@Get()`, `@Post()`, ...: the handler's path (@nestjs/common PATH_METADATA). */
const PATH_METADATA = 'path';
/** `@Header(name, value)` (@nestjs/common HEADERS_METADATA). */
const HEADERS_METADATA = '__headers__';
/** `@RouteConfig()`: the Fastify route `config` Nest registers the route with (@nestjs/platform-fastify). */
const FASTIFY_ROUTE_CONFIG_METADATA = '__fastify_route_config__';

export type Platform = 'express' | 'fastify';

/** How the Express platform covers one handler. */
export interface ExpressRoute {
  /** `@oncely/express`'s middleware with the route's options. */
  middleware: RequestHandler;
  /**
   * Headers Nest sets from `@Header()` before interceptors run: taken off while oncely decides, so a replay or a
   * problem answer carries only what oncely sends, and put back for the handler.
   */
  decoratorHeaders: readonly string[];
}

/** Per handler function, the controller and mark its Fastify route config was written for. */
type WrittenConfigs = WeakMap<object, { controller: Type; setting: IdempotentSetting | undefined }>;

/** What `configure()` needs from the routes: the module's constructor is typed by this alone. */
export interface RouteMounter {
  mount(): Promise<void>;
}

/**
 * Knows, per handler, whether and how oncely covers it, and puts `@oncely/express` or `@oncely/fastify` in
 * place. Runs from the module's `configure()`, which Nest calls before it registers any route.
 */
@Injectable()
export class IdempotencyRoutes implements RouteMounter {
  #platform: Platform | undefined;
  // A method inherited by two controllers is one function, so two different marks on it cannot both reach Fastify.
  // Per application: two apps in one process (tests) each write their own.
  readonly #fastifyConfigWritten: WrittenConfigs = new WeakMap();

  /** The platform found at startup; `undefined` before, or in an application without HTTP. */
  get platform(): Platform | undefined {
    return this.#platform;
  }
  readonly #config: ModuleConfig;
  readonly #discovery: DiscoveryService;
  readonly #scanner: MetadataScanner;
  readonly #adapterHost: HttpAdapterHost;
  #moduleMiddleware: RequestHandler | undefined;
  /** Express: per controller, per handler function, its middleware, or `null` when it is not covered. */
  readonly #express = new WeakMap<Type, Map<object, ExpressRoute | null>>();

  constructor(
    @Inject(IDEMPOTENCY_CONFIG) config: ModuleConfig,
    @Inject(DiscoveryService) discovery: DiscoveryService,
    @Inject(MetadataScanner) scanner: MetadataScanner,
    @Inject(HttpAdapterHost) adapterHost: HttpAdapterHost,
  ) {
    this.#config = config;
    this.#discovery = discovery;
    this.#scanner = scanner;
    this.#adapterHost = adapterHost;
  }

  async mount(): Promise<void> {
    const adapter = this.#adapterHost.httpAdapter;
    // An application context without HTTP (NestFactory.createApplicationContext): nothing to cover.
    if (adapter === undefined || adapter === null) return;
    const type = adapter.getType();
    if (type !== 'express' && type !== 'fastify') {
      throw new IdempotencySetupError(
        `@oncely/nestjs runs on @nestjs/platform-express and @nestjs/platform-fastify; this application's HTTP adapter is "${type}".`,
      );
    }
    this.#platform = type;
    // Every handler's options are checked now, at startup, not on its first request.
    for (const [controller, handler, name] of this.#handlers()) {
      const setting = settingOf(controller, handler);
      if (setting !== undefined && setting !== false) checkRouteOptions(this.#config, setting, name);
      if (type === 'express') this.#expressRoute(controller, handler, setting);
      else writeFastifyConfig(this.#fastifyConfigWritten, controller, handler, setting, name);
    }
    if (type === 'fastify') await this.#registerFastify(adapter.getInstance<FastifyInstance>());
  }

  /**
   * Routes are registered after configure(): awaited here, the plugin's onRoute hook sees every one of them.
   *
   * A plugin registered in main.ts (before this) that adds a route `onSend` hook in onRoute, such as
   * `@fastify/compress`, would have its hook run before oncely's, and oncely would store what it made (gzip bytes,
   * replayed to clients that did not ask for them). oncely's own hooks are moved first, so it stores what the
   * handler answered and those hooks run on every answer, first or replayed, as they were registered to.
   */
  async #registerFastify(fastify: FastifyInstance): Promise<void> {
    const earlier = new WeakMap<object, ReadonlySet<unknown>>();
    fastify.addHook('onRoute', (route) => {
      earlier.set(route, new Set(toArray(route.onSend)));
    });
    // App-wide, so it runs before the route's own onSend hooks, oncely's among them.
    fastify.addHook('onSend', async (request, _reply, payload) => {
      if (!enteredRequests.has(request)) {
        noteHandlerError(request, new Error('answered before the handler (a guard or an interceptor)'));
      }
      return payload;
    });
    await fastify.register(idempotencyPlugin, { ...this.#config.shared, global: this.#config.global });
    fastify.addHook('onRoute', (route) => {
      const before = earlier.get(route);
      const hooks = toArray(route.onSend);
      if (before === undefined || before.size === 0) return;
      const added = hooks.filter((hook) => !before.has(hook));
      if (added.length > 0) route.onSend = [...added, ...hooks.filter((hook) => before.has(hook))];
    });
  }

  /** Express: the handler's route, or `null` when oncely does not cover it. */
  expressRoute(controller: Type, handler: object): ExpressRoute | null {
    const known = this.#express.get(controller)?.get(handler);
    if (known !== undefined) return known;
    // A handler discovery did not list (added after startup): decided on its first request, then kept.
    return this.#expressRoute(controller, handler, settingOf(controller, handler));
  }

  #expressRoute(
    controller: Type,
    handler: object,
    setting: IdempotentSetting | undefined,
  ): ExpressRoute | null {
    let route: ExpressRoute | null = null;
    if (setting !== false && (setting !== undefined || this.#config.global)) {
      const own = setting === undefined ? undefined : optionsSet(setting);
      const headers = (Reflect.getMetadata(HEADERS_METADATA, handler) ?? []) as { name: string }[];
      route = {
        middleware: own !== undefined ? idempotency({ ...this.#config.shared, ...own }) : this.#module(),
        decoratorHeaders: headers.map((header) => header.name),
      };
    }
    let routes = this.#express.get(controller);
    if (routes === undefined) {
      routes = new Map();
      this.#express.set(controller, routes);
    }
    routes.set(handler, route);
    return route;
  }

  /** The module's middleware, shared by the routes without options of their own (one engine, one warning). */
  #module(): RequestHandler {
    this.#moduleMiddleware ??= idempotency(this.#config.shared);
    return this.#moduleMiddleware;
  }

  /** Every route handler of every controller: the controller, the handler function, and `Controller.method`. */
  *#handlers(): Generator<[Type, object, string]> {
    for (const wrapper of this.#discovery.getControllers()) {
      const controller = wrapper.metatype as Type | null | undefined;
      if (typeof controller !== 'function' || controller.prototype === undefined) continue;
      const prototype = controller.prototype as Record<string, unknown>;
      for (const name of this.#scanner.getAllMethodNames(prototype)) {
        const handler = prototype[name];
        if (typeof handler !== 'function' || Reflect.getMetadata(PATH_METADATA, handler) === undefined)
          continue;
        yield [controller, handler, `${controller.name}.${name}`];
      }
    }
  }
}

/** `@Sse()` (@nestjs/common SSE_METADATA). */
const SSE_METADATA = '__sse__';

/**
 * The handler's mark, else its controller's. An `@Sse()` route is never covered: its events are a stream that
 * must reach the client as they come, and holding them until stored would hold them all.
 */
function settingOf(controller: Type, handler: object): IdempotentSetting | undefined {
  if (Reflect.getMetadata(SSE_METADATA, handler) === true) return false;
  return (Reflect.getMetadata(IDEMPOTENT_METADATA, handler) ??
    Reflect.getMetadata(IDEMPOTENT_METADATA, controller)) as IdempotentSetting | undefined;
}

/**
 * Fastify: `@oncely/fastify` decides per route in its onRoute hook, from `config.idempotency`. Nest builds a
 * route's config from the handler's `@RouteConfig()` metadata when it registers the route, after configure():
 * the mark is merged into that metadata here, so it does not matter in which order the decorators were written.
 */
function writeFastifyConfig(
  fastifyConfigWritten: WrittenConfigs,
  controller: Type,
  handler: object,
  setting: IdempotentSetting | undefined,
  name: string,
): void {
  const written = fastifyConfigWritten.get(handler);
  if (written !== undefined && written.controller !== controller && !sameSetting(written.setting, setting)) {
    throw new IdempotencySetupError(
      `@oncely/nestjs: ${name} is a handler inherited by ${written.controller.name} too, and the two controllers mark it differently with @Idempotent(); on Fastify a route's options belong to the handler function: put @Idempotent() on the handler in each controller (override it).`,
    );
  }
  fastifyConfigWritten.set(handler, { controller, setting });
  if (setting === undefined) return;
  const config = Reflect.getMetadata(FASTIFY_ROUTE_CONFIG_METADATA, handler) as
    | Record<string, unknown>
    | undefined;
  Reflect.defineMetadata(FASTIFY_ROUTE_CONFIG_METADATA, { ...config, idempotency: setting }, handler);
}

/**
 * The options a mark sets, or `undefined` when it sets none: its own keys, symbols included (`...otel()` is one),
 * whose value is not `undefined`. An option given as `undefined` inherits the module's, as on Fastify (where the
 * route's engine is the module's `with()` the mark); spread over the module's options it would reset it to the
 * default instead (another `scope`, a store of its own).
 */
function optionsSet(setting: object): IdempotentOptions | undefined {
  const set: Record<PropertyKey, unknown> = {};
  let any = false;
  for (const key of Reflect.ownKeys(setting)) {
    const value = (setting as Record<PropertyKey, unknown>)[key];
    if (value === undefined) continue;
    set[key] = value;
    any = true;
  }
  return any ? (set as IdempotentOptions) : undefined;
}

/** Two marks with the same options (each `@Idempotent()` makes an object of its own); symbol keys count. */
function sameSetting(a: IdempotentSetting | undefined, b: IdempotentSetting | undefined): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object') return false;
  const ownA = optionsSet(a) ?? {};
  const ownB = optionsSet(b) ?? {};
  const keys = Reflect.ownKeys(ownA);
  return (
    keys.length === Reflect.ownKeys(ownB).length &&
    keys.every(
      (key) => (ownA as Record<PropertyKey, unknown>)[key] === (ownB as Record<PropertyKey, unknown>)[key],
    )
  );
}

function toArray<T>(value: T | T[] | undefined): T[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}
