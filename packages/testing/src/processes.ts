import { type ChildProcess, spawn } from 'node:child_process';
import { Agent, request } from 'node:http';
import { createInterface } from 'node:readline';

/** An app server in a process of its own, started from a TypeScript file (run with tsx, packages from source). */
export interface AppProcess {
  url: string;
  child: ChildProcess;
  /** Resolves with the next stdout line (after the port line) that `match` accepts. */
  waitForLine(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
}

/**
 * Starts `script` with `node --conditions=@oncely/source --import tsx`; the script must print one JSON line
 * `{"port": n}` on stdout once it listens on 127.0.0.1.
 */
export function startAppProcess(script: string, env: Record<string, string>): Promise<AppProcess> {
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
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      void kill();
      reject(new Error(`${script} did not report a port within 20s`));
    }, 20_000);
    child.once('exit', (code, signal) => reject(new Error(`${script} exited early (${code ?? signal})`)));
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
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
    lines.once('line', (line) => {
      clearTimeout(timer);
      try {
        const { port } = JSON.parse(line) as { port: number };
        resolve({ url: `http://127.0.0.1:${port}`, child, kill, waitForLine });
      } catch (error) {
        reject(error);
      }
    });
  });
}

export interface SentRequest {
  key: string;
  status: number;
  replayed: boolean;
  body: string;
}

/**
 * Fires `total` POSTs at once, spread round-robin over `urls`, keys cycling over `keys`. Every request is issued
 * before any answer is awaited; sockets are capped per server (`maxSockets`) so the OS is not the bottleneck.
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
        const url = new URL(options.path, options.urls[i % options.urls.length]);
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
