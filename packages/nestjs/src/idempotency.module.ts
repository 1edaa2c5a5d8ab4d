import {
  type DynamicModule,
  type FactoryProvider,
  Inject,
  Module,
  type ModuleMetadata,
  type NestModule,
  type Provider,
} from '@nestjs/common';
import { APP_INTERCEPTOR, DiscoveryModule } from '@nestjs/core';
import { IdempotencyInterceptor } from './interceptor';
import {
  type IdempotencyModuleAsyncOptions,
  type IdempotencyModuleOptions,
  resolveModuleOptions,
} from './options';
import { IdempotencyRoutes, type RouteMounter } from './routes';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_MODULE_OPTIONS } from './tokens';

/**
 * oncely for a Nest application, on `@nestjs/platform-express` or `@nestjs/platform-fastify`. Import it once, in
 * the root module: `IdempotencyModule.forRoot({ store, global: true })`.
 */
@Module({})
export class IdempotencyModule implements NestModule {
  readonly #routes: RouteMounter;

  /** Made by Nest's injector, which passes the module's routes; an app does not construct it. */
  constructor(@Inject(IdempotencyRoutes) routes: RouteMounter) {
    this.#routes = routes;
  }

  /** Options given as they are; checked when Nest creates the module. */
  static forRoot(options: IdempotencyModuleOptions = {}): DynamicModule {
    return moduleWith([], { provide: IDEMPOTENCY_MODULE_OPTIONS, useValue: options });
  }

  /** Options made by a factory from other providers (`inject`), from the modules in `imports`. */
  static forRootAsync(options: IdempotencyModuleAsyncOptions): DynamicModule {
    const provider: FactoryProvider<IdempotencyModuleOptions | Promise<IdempotencyModuleOptions>> = {
      provide: IDEMPOTENCY_MODULE_OPTIONS,
      // The factory's parameters are whatever `inject` names; Nest passes them in that order.
      useFactory: options.useFactory as (...args: unknown[]) => IdempotencyModuleOptions,
      inject: options.inject ?? [],
    };
    return moduleWith(options.imports ?? [], provider);
  }

  /** Nest calls this before it registers the routes: the adapter is put in place for all of them. */
  configure(): Promise<void> {
    return this.#routes.mount();
  }
}

function moduleWith(imports: NonNullable<ModuleMetadata['imports']>, options: Provider): DynamicModule {
  return {
    module: IdempotencyModule,
    imports: [DiscoveryModule, ...imports],
    providers: [
      options,
      { provide: IDEMPOTENCY_CONFIG, useFactory: resolveModuleOptions, inject: [IDEMPOTENCY_MODULE_OPTIONS] },
      IdempotencyRoutes,
      { provide: APP_INTERCEPTOR, useClass: IdempotencyInterceptor },
    ],
  };
}
