import { type ChildProcess, spawn } from 'node:child_process';
import { Agent, request } from 'node:http';
import { createInterface, type Interface } from 'node:readline';

/** An app server in a process of its own, started from a TypeScript file (run with tsx, packages from source). */
export interface AppProcess {
  url: string;
  child: ChildProcess;
  /** Resolves with the next stdout line (after the port line) that `match` accepts. */
  waitForLine(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
}

/** A TypeScript script in a process of its own (tsx, packages from source), and its stdout as lines. */
export interface SourceProcess {
  child: ChildProcess;
  lines: Interface;
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
  /**
   * The first stdout line; rejects if the process exits first or prints nothing within 60 s (`what` names it).
   * Generous: tsx compiles the script and its imports at start, which takes over 20 s when several start at once on
   * a loaded machine.
   */
  firstLine(what: string): Promise<string>;
}

/** Starts `script` with `node --conditions=@oncely/source --import tsx`, stderr inherited. */
export function spawnSource(script: string, env: Record<string, string>): SourceProcess {
  const child = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', script], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const kill = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGKILL');
    });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const firstLine = (what: string) =>
    new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        void kill();
        reject(new Error(`${script} ${what} within 60s`));
      }, 60_000);
      const early = (code: number | null, signal: string | null) =>
        reject(new Error(`${script} exited early (${code ?? signal})`));
      child.once('exit', early);
      lines.once('line', (line) => {
        clearTimeout(timer);
        child.off('exit', early);
        resolve(line);
      });
    });
  return { child, lines, kill, firstLine };
}

/**
 * Starts `script` (see `spawnSource`); the script must print one JSON line `{"port": n}` on stdout once it
 * listens on 127.0.0.1.
 */
export async function startAppProcess(script: string, env: Record<string, string>): Promise<AppProcess> {
  const { child, lines, kill, firstLine } = spawnSource(script, env);
  const waitForLine = (match: (line: string) => boolean, timeoutMs = 20_000) =>
    new Promise<string>((resolveLine, rejectLine) => {
      const onLine = (line: string) => {
        if (!match(line)) return;
        clearTimeout(lineTimer);
        lines.off('line', onLine);
        resolveLine(line);
      };
      const lineTimer = setTimeout(() => {
        lines.off('line', onLine);
        rejectLine(new Error(`${script}: no matching line within ${timeoutMs}ms`));
      }, timeoutMs);
      lines.on('line', onLine);
    });
  const { port } = JSON.parse(await firstLine('did not report a port')) as { port: number };
  return { url: `http://127.0.0.1:${port}`, child, kill, waitForLine };
}

export interface SentRequest {
  key: string;
  status: number;
  replayed: boolean;
  body: string;
}

/**
 * Fires `total` POSTs at once, spread round-robin over `urls`, keys cycling over `keys`; a key's requests go to
 * every server in turn, so duplicates race across processes. Every request is issued before any answer is awaited;
 * sockets are capped per server (`maxSockets`) so the OS is not the bottleneck.
 */
export async function fireAtOnce(options: {
  urls: string[];
  path: string;
  keys: string[];
  total: number;
  body?: string;
  maxSockets?: number;
}): Promise<SentRequest[]> {
  const agent = new Agent({ keepAlive: true, maxSockets: options.maxSockets ?? 64 });
  const body = options.body ?? '{"amount":1}';
  try {
    return await Promise.all(
      Array.from({ length: options.total }, (_, i) => {
        const key = options.keys[i % options.keys.length] as string;
        // Each pass over the keys starts one server further on, so a key's duplicates reach every server (with
        // `i % urls.length`, a key count that the server count divides would pin each key to one server).
        const server = (i + Math.floor(i / options.keys.length)) % options.urls.length;
        const url = new URL(options.path, options.urls[server]);
        return new Promise<SentRequest>((resolve, reject) => {
          const req = request(
            url,
            {
              method: 'POST',
              agent,
              headers: {
                'content-type': 'application/json',
                'content-length': Buffer.byteLength(body),
                'idempotency-key': key,
              },
            },
            (res) => {
              const chunks: Buffer[] = [];
              res.on('data', (chunk: Buffer) => chunks.push(chunk));
              res.on('end', () =>
                resolve({
                  key,
                  status: res.statusCode ?? 0,
                  replayed: res.headers['idempotent-replayed'] === 'true',
                  body: Buffer.concat(chunks).toString(),
                }),
              );
            },
          );
          req.on('error', reject);
          req.end(body);
        });
      }),
    );
  } finally {
    agent.destroy();
  }
}
