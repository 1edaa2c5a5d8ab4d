import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { BACKENDS, URL_VARIABLES } from './backends';
import type { Backend, ConnectOptions } from './backends/types';
import { EXIT, isCliError, isStoreOperationError, unknownLayout, usageError } from './errors';
import { formatList, formatRecord, formatStats } from './format';
import { storeKeyOf } from './records';

/** Where the command reads and writes: the process's streams (the bin), or a test's. */
export interface Io {
  /** Where the command writes what it shows. */
  stdout: {
    /** Writes text as given (the command supplies the newlines). */
    write(text: string): unknown;
    /** Whether it is a terminal (the command does not read it). */
    isTTY?: boolean;
  };
  /** Where the command writes errors and progress. */
  stderr: {
    /** Writes text as given (the command supplies the newlines). */
    write(text: string): unknown;
    /** Whether it is a terminal: stats shows its progress only then. */
    isTTY?: boolean;
  };
  /** Read for delete's confirmation, on a terminal only. */
  stdin: NodeJS.ReadableStream & {
    /** Whether it is a terminal: delete asks only then. */
    isTTY?: boolean;
  };
  /** The environment the command reads its store URL (`ONCELY_URL`, `REDIS_URL`, ...) and credentials from. */
  env: Record<string, string | undefined>;
}

const USAGE = `Usage: oncely <command> [options]

Commands:
  inspect <key>    show the record of an idempotency key
  delete <key>     show it, then remove it (asks on a terminal; --yes to skip, required off a terminal)
  list             list records, a page at a time (--limit, --cursor)
  stats            count records by state, with the memory or bytes they take

Options:
  --url URL        redis://, rediss://, redis-cluster://, postgres://, mysql://, dynamodb://TABLE?region=..&endpoint=..
                   (default: $ONCELY_URL, $REDIS_URL, $DATABASE_URL or $DYNAMODB_URL, the first one set)
  --node HOST:PORT a Redis Cluster seed node (repeatable; implies --cluster)
  --cluster        the Redis URL is a Cluster node
  --prefix P       the store's key prefix (default: the store's, "oncely:")
  --table T        the store's table (SQL: default the store's; DynamoDB: instead of naming it in the URL)
  --scope S        the scope the app gives the key (scope option); list: only records of that scope
  --in-progress    list: only records whose lease is held
  --limit N        list: at most N records (default 20)
  --cursor C       list: the page after the one that printed this cursor
  --yes            delete without asking
  --json           machine-readable output
  --timeout MS     how long to wait for the store (default 5000)
  -h, --help       this help

Exit codes: 0 ok, 1 no such record, 2 usage, 3 store unreachable, 4 unknown record layout,
            5 store client not installed, 6 delete declined.
`;

const OPTIONS = {
  url: { type: 'string' },
  node: { type: 'string', multiple: true },
  cluster: { type: 'boolean' },
  prefix: { type: 'string' },
  table: { type: 'string' },
  scope: { type: 'string' },
  'in-progress': { type: 'boolean' },
  limit: { type: 'string' },
  cursor: { type: 'string' },
  yes: { type: 'boolean', short: 'y' },
  json: { type: 'boolean' },
  timeout: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

type Values = ReturnType<typeof parse>['values'];

function parse(argv: string[]) {
  return parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
}

function positiveInteger(value: string | undefined, fallback: number, option: string): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 1) throw usageError(`--${option} must be a whole number of at least 1`);
  return n;
}

/** The store to connect to: `--url`, `--node`s, or the first URL variable set. */
export function connectOptions(values: Values, env: Io['env']): ConnectOptions {
  const nodes = values.node ?? [];
  let text = values.url;
  if (text === undefined && nodes.length > 0) text = `redis-cluster://${nodes[0]}`;
  if (text === undefined) {
    for (const name of URL_VARIABLES) {
      const value = env[name];
      if (value !== undefined && value !== '') {
        text = value;
        break;
      }
    }
  }
  if (text === undefined) {
    throw usageError(`no store given: pass --url (or --node), or set one of ${URL_VARIABLES.join(', ')}`);
  }
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw usageError(`--url is not a URL: ${redact(text)}`);
  }
  if (BACKENDS[url.protocol] === undefined) {
    throw usageError(`unknown store URL scheme ${url.protocol} (known: ${Object.keys(BACKENDS).join(' ')})`);
  }
  return {
    url,
    nodes,
    cluster: values.cluster === true || nodes.length > 0 || url.protocol === 'redis-cluster:',
    prefix: values.prefix,
    table: values.table,
    connectTimeoutMs: positiveInteger(values.timeout, 5000, 'timeout'),
    env,
  };
}

/** A URL as it may be printed: without its password. */
export function redact(text: string): string {
  return text.replace(/\/\/([^/@:]*):[^/@]*@/, '//$1:***@');
}

async function open(options: ConnectOptions): Promise<Backend> {
  const load = BACKENDS[options.url.protocol];
  if (load === undefined) throw usageError(`unknown store URL scheme ${options.url.protocol}`);
  return (await load())(options);
}

async function confirm(io: Io, question: string): Promise<boolean> {
  const lines = createInterface({ input: io.stdin, output: undefined, terminal: false });
  io.stderr.write(question);
  try {
    const answer = await new Promise<string>((resolve) => {
      lines.once('line', resolve);
      lines.once('close', () => resolve(''));
    });
    return /^y(es)?$/i.test(answer.trim());
  } finally {
    lines.close();
  }
}

function json(value: unknown): string {
  return `${JSON.stringify(value, null, 2)}\n`;
}

async function run(command: string, args: string[], values: Values, io: Io): Promise<number> {
  const needsKey = command === 'inspect' || command === 'delete';
  if (needsKey ? args.length !== 1 : args.length !== 0) {
    throw usageError(
      needsKey ? `${command} takes one key: oncely ${command} <key>` : `${command} takes no arguments`,
    );
  }
  if (!needsKey && command !== 'list' && command !== 'stats') throw usageError(`unknown command ${command}`);
  if (values.yes === true && command !== 'delete') throw usageError('--yes is for delete only');
  if (values['in-progress'] === true && command !== 'list')
    throw usageError('--in-progress is for list only');
  if (values.scope !== undefined && command === 'stats')
    throw usageError('stats counts every scope: no --scope');
  if ((values.limit !== undefined || values.cursor !== undefined) && command !== 'list') {
    throw usageError('--limit and --cursor are for list only');
  }
  const limit = positiveInteger(values.limit, 20, 'limit');
  const options = connectOptions(values, io.env);
  // Refused before connecting: a script piping into delete without --yes learns it at once.
  if (command === 'delete' && values.yes !== true && io.stdin.isTTY !== true) {
    throw usageError('delete asks for confirmation on a terminal; off a terminal, pass --yes');
  }
  const backend = await open(options);
  try {
    if (needsKey) {
      const key = args[0] as string;
      const storeKey = storeKeyOf(key, values.scope);
      const record = await backend.inspect(storeKey);
      if (record === undefined) {
        if (values.json === true) io.stdout.write(json({ found: false, key, scope: values.scope ?? null }));
        else
          io.stderr.write(
            `oncely: no record for key ${JSON.stringify(key)}${values.scope === undefined ? '' : ` in scope ${JSON.stringify(values.scope)}`} (${backend.description})\n`,
          );
        return EXIT.notFound;
      }
      if (command === 'inspect') {
        io.stdout.write(values.json === true ? json(record) : formatRecord(record));
        return EXIT.ok;
      }
      if (values.json !== true) io.stdout.write(formatRecord(record));
      if (values.yes !== true && !(await confirm(io, 'Delete this record? [y/N] '))) {
        io.stderr.write('oncely: not deleted\n');
        return EXIT.declined;
      }
      const deleted = await backend.delete(storeKey);
      if (values.json === true) io.stdout.write(json({ deleted, record }));
      else io.stdout.write(deleted ? 'deleted\n' : 'already gone (expired or deleted meanwhile)\n');
      return deleted ? EXIT.ok : EXIT.notFound;
    }
    if (command === 'list') {
      const page = await backend.list({
        limit,
        ...(values['in-progress'] === true ? { inProgress: true } : {}),
        ...(values.scope === undefined ? {} : { scope: values.scope }),
        ...(values.cursor === undefined ? {} : { cursor: values.cursor }),
      });
      io.stdout.write(values.json === true ? json(page) : formatList(page));
      if (page.unknown !== undefined && page.unknown.length > 0 && values.json !== true) {
        io.stderr.write(
          `oncely: ${page.unknown.length} key(s) under the prefix are not oncely records of a known layout: ${page.unknown.slice(0, 5).join(', ')}\n`,
        );
      }
      return EXIT.ok;
    }
    const progress =
      io.stderr.isTTY === true ? (n: number) => io.stderr.write(`\rscanned ${n} keys`) : undefined;
    const stats = await backend.stats(progress);
    if (progress !== undefined) io.stderr.write('\r\u001b[K');
    io.stdout.write(values.json === true ? json(stats) : formatStats(stats, backend.description));
    return EXIT.ok;
  } finally {
    await backend.close().catch(() => {});
  }
}

/**
 * Runs the command with `argv` (the arguments after `oncely`) and resolves its exit code; never rejects for a
 * store or usage problem (it prints one line to stderr and resolves the code, see `EXIT`).
 */
export async function main(argv: string[], io: Io): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (error) {
    io.stderr.write(`oncely: ${(error as Error).message}\n\n${USAGE}`);
    return EXIT.usage;
  }
  const [command, ...args] = parsed.positionals;
  if (parsed.values.help === true || command === 'help') {
    io.stdout.write(USAGE);
    return EXIT.ok;
  }
  if (command === undefined) {
    io.stderr.write(USAGE);
    return EXIT.usage;
  }
  try {
    return await run(command, args, parsed.values, io);
  } catch (error) {
    const failure = isCliError(error)
      ? error
      : isStoreOperationError(error)
        ? unknownLayout('this key', error)
        : undefined;
    if (failure === undefined) throw error;
    io.stderr.write(`oncely: ${failure.message}\n`);
    return failure.exitCode;
  }
}
