/** The slice of a pino logger oncely uses. A pino logger, Fastify's `request.log` or `console`-like objects fit. */
export interface Logger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

const noop = (): void => {};
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop };
