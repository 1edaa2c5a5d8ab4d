import { type Logger, silentLogger } from './logger';

/**
 * The codes of oncely's process warnings. `node --disable-warning=<code> app.js` (or `NODE_OPTIONS`) silences one;
 * a `logger` receives them instead.
 */
export type WarningCode =
  | 'ONCELY_BODY_NOT_PARSED'
  | 'ONCELY_STORE_UNAVAILABLE'
  | 'ONCELY_UNSCOPED_CREDENTIALS'
  | 'ONCELY_SCOPE_UNSET'
  | 'ONCELY_MESSAGE_WITHOUT_KEY'
  | 'ONCELY_HOOK_THREW';

/**
 * Says something the user must see, logger or not: through `log` at `level` when the user gave one
 * (`silentLogger` stands for none), each time it is called; without one, as a Node process warning with `code`,
 * which Node prints to stderr, once per kind and per `said` (an engine, a wrapped handler), since a line logged
 * nowhere would hide a wiring mistake and one per request would flood stderr.
 */
export function tell(
  log: Logger,
  level: 'warn' | 'error',
  code: WarningCode,
  fields: object,
  message: string,
  said: Set<WarningCode>,
): void {
  if (log !== silentLogger) {
    log[level](fields, message);
    return;
  }
  if (said.has(code) || typeof globalThis.process?.emitWarning !== 'function') return;
  said.add(code);
  process.emitWarning(message, { code });
}

/**
 * The message of an error, for a process warning (which has no fields to carry the error itself). Never throws:
 * a store or hook may throw anything, even an object whose every property access throws.
 */
export function errorText(error: unknown): string {
  try {
    return error instanceof Error ? String(error.message) : String(error);
  } catch {
    return 'an error that cannot be described';
  }
}

/** A user's hook threw: the request or message goes on, and the user hears of it. */
export function tellHookThrew(log: Logger, hook: string, error: unknown, said: Set<WarningCode>): void {
  tell(
    log,
    'error',
    'ONCELY_HOOK_THREW',
    { err: error, hook },
    log === silentLogger
      ? `oncely: the ${hook} hook threw (${errorText(error)}); ignored. Said once; give a logger to see each.`
      : 'oncely: a hook threw; ignored',
    said,
  );
}
