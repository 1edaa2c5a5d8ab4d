/** The slice of a pino logger oncely uses. A pino logger, Fastify's `request.log` or `console`-like objects fit. */
export interface Logger {
  /** Logs details that help debugging, with the fields in `obj`. */
  debug(obj: object, msg?: string): void;
  /** Logs an ordinary event, with the fields in `obj`. */
  info(obj: object, msg?: string): void;
  /** Logs something that needs attention (a misconfiguration, a hook that threw), with the fields in `obj`. */
  warn(obj: object, msg?: string): void;
  /** Logs a failure, with the fields in `obj` (`err` holds the error). */
  error(obj: object, msg?: string): void;
}

const noop = (): void => {};
/** A logger that discards everything: what oncely logs to when no `logger` is given. */
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop };
