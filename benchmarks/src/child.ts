// Children of the runner: a server (prints {"port": n} first) or a store benchmark (prints one JSON line last).
// Each runs `node [flags] --import tsx <script>` in benchmarks/, so tsx reads benchmarks/tsconfig.json; packages
// load from their built dist (no @oncely/source condition), which is what users run.
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const BENCH_DIR = join(dirname(fileURLToPath(import.meta.url)), '..');

export interface Child {
  child: ChildProcess;
  /** The last lines of stderr, for error messages. */
  stderr(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves when it exited. */
  stop(graceMs?: number): Promise<void>;
  exited: Promise<number | null>;
}

export function startChild(
  script: string,
  config: unknown,
  nodeFlags: string[] = [],
  env: Record<string, string> = {},
): Child {
  const child = spawn(process.execPath, [...nodeFlags, '--import', 'tsx', join(BENCH_DIR, script)], {
    cwd: BENCH_DIR,
    env: {
      ...process.env,
      // The AWS SDK warns once per process that its next releases need Node 22: noise here.
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
      ...env,
      BENCH_CONFIG: JSON.stringify(config),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const errLines: string[] = [];
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    errLines.push(chunk);
    if (errLines.length > 40) errLines.shift();
  });
  const exited = new Promise<number | null>((resolve) => {
    child.once('exit', (code) => resolve(code));
  });
  const stop = async (graceMs = 5000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  };
  return { child, stderr: () => errLines.join('').trim().split('\n').slice(-15).join('\n'), stop, exited };
}

/** Resolves with the first stdout line (parsed as JSON); the rest of stdout is drained and dropped. */
export function firstLine<T>(proc: Child, what: string, timeoutMs = 30_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.child.stdout as NodeJS.ReadableStream });
    let done = false;
    const timer = setTimeout(() => {
      if (done) return;
      done = true;
      void proc.stop(0);
      reject(new Error(`${what} did not start within ${timeoutMs} ms\n${proc.stderr()}`));
    }, timeoutMs);
    void proc.exited.then((code) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}) before reporting\n${proc.stderr()}`));
    });
    lines.on('line', (line) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      try {
        resolve(JSON.parse(line) as T);
      } catch {
        reject(new Error(`${what} printed ${JSON.stringify(line)} instead of JSON\n${proc.stderr()}`));
      }
    });
  });
}

/** Resolves with the last stdout line (parsed as JSON) once the child exits 0. */
export async function lastLine<T>(proc: Child, what: string): Promise<T> {
  let last = '';
  const lines = createInterface({ input: proc.child.stdout as NodeJS.ReadableStream });
  lines.on('line', (line) => {
    if (line.trim() !== '') last = line;
  });
  const closed = new Promise((resolve) => lines.once('close', resolve));
  const code = await proc.exited;
  await closed;
  if (code !== 0) throw new Error(`${what} exited with ${code}\n${proc.stderr()}`);
  try {
    return JSON.parse(last) as T;
  } catch {
    throw new Error(`${what} ended with ${JSON.stringify(last)} instead of JSON\n${proc.stderr()}`);
  }
}
