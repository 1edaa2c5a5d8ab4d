/** The options given to forRoot() or made by forRootAsync()'s factory. */
export const IDEMPOTENCY_MODULE_OPTIONS = Symbol('oncely.nestjs.moduleOptions');
/** The module's options once checked (`ModuleConfig`). */
export const IDEMPOTENCY_CONFIG = Symbol('oncely.nestjs.config');
