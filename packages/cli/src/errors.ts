import { withinDeadline } from '@oncely/core/adapter';

/**
 * The command's exit codes, for scripts:
 *   0  done (inspect and list found what they show, delete removed the record, stats counted)
 *   1  no record under that key
 *   2  usage: an unknown command or option, a missing argument, a delete without --yes off a terminal
 *   3  the store could not be reached (or answered with an error) within the connect timeout
 *   4  a record of a layout this version does not know (another app's key under the prefix, or a newer oncely),
 *      or a table the store does not have
 *   5  a missing store client (install ioredis, pg, mysql2 or @aws-sdk/client-dynamodb)
 *   6  delete declined at the prompt
 */
export const EXIT = {
  /** Done. */
  ok: 0,
  /** No record under that key. */
  notFound: 1,
  /** An unknown command or option, a missing argument, or a delete without `--yes` off a terminal. */
  usage: 2,
  /** The store could not be reached, or answered with an error, within the connect timeout. */
  unreachable: 3,
  /** A record of a layout this version does not know, or a missing table. */
  unknownLayout: 4,
  /** The store's client package is not installed. */
  missingDriver: 5,
  /** Delete declined at the prompt. */
  declined: 6,
} as const;

/** One of the command's exit codes ({@link EXIT}). */
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** An error the command reports in one line and exits with its code. */
export class CliError extends Error {
  /** Always `CliError`, to recognise one across copies of this module. */
  override readonly name = 'CliError';
  /** An error the command exits with `exitCode` on, printing `message`; `options.cause` keeps what caused it. */
  constructor(
    /** The code the command exits with. */
    readonly exitCode: ExitCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * Whether `error` is a `CliError`, by its shape: a second copy of this module (the CommonJS build next to the ESM
 * one) makes errors that `instanceof` would not recognise.
 */
export function isCliError(error: unknown): error is CliError {
  return (
    error instanceof Error && error.name === 'CliError' && typeof (error as CliError).exitCode === 'number'
  );
}

/** A store's own finding that a record is none it knows (`StoreOperationError`, from any copy of @oncely/core). */
export function isStoreOperationError(error: unknown): boolean {
  return error instanceof Error && error.name === 'StoreOperationError';
}

export const usageError = (message: string) => new CliError(EXIT.usage, message);

/** A store that cannot be reached, answered with an error, or took longer than the timeout. */
export function unreachable(where: string, cause: unknown): CliError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new CliError(EXIT.unreachable, `cannot reach ${where}: ${reason}`, { cause });
}

/** A record the store's decoder refused: not one of the layouts this version knows. */
export function unknownLayout(location: string, cause?: unknown): CliError {
  const reason = cause instanceof Error ? `: ${cause.message}` : '';
  return new CliError(
    EXIT.unknownLayout,
    `the record at ${location} is not of a layout this version of oncely knows${reason} (another app's key under the prefix, or written by a newer oncely: upgrade @oncely/cli)`,
    { cause },
  );
}

/** Rejects with `unreachable` if `promise` has not settled within `ms`; never leaves a timer behind. */
export function within<T>(promise: Promise<T>, ms: number, where: string): Promise<T> {
  return withinDeadline(ms, promise, () => unreachable(where, new Error(`no answer within ${ms} ms`)));
}

/** Loads a store client the user installs, with the command to install it when it is missing. */
export async function loadDriver<T>(name: string, load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') {
      throw new CliError(
        EXIT.missingDriver,
        `this store needs the ${name} package, which is not installed: npm install ${name} (in the project), or npx -p @oncely/cli -p ${name} oncely ...`,
        { cause: error },
      );
    }
    throw error;
  }
}

/**
 * A wrapper for a backend's store calls: what they reject with becomes the command's error, exit 4 for a record the
 * store's decoder refused (`isLayoutError`, at `location`), 3 for any other failure of the store at `where`.
 */
export function guarded(
  where: string,
  isLayoutError: (error: unknown) => boolean,
): <T>(promise: Promise<T>, location: string) => Promise<T> {
  return async (promise, location) => {
    try {
      return await promise;
    } catch (error) {
      if (isCliError(error)) throw error;
      if (isLayoutError(error)) throw unknownLayout(location, error);
      throw unreachable(where, error);
    }
  };
}
