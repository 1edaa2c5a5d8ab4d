import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';

/** The repository's root: the nearest folder above this file with pnpm-workspace.yaml. */
export function repositoryRoot(): string {
  let dir = __dirname;
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`no pnpm-workspace.yaml above ${__dirname}`);
    dir = parent;
  }
  return dir;
}

/** A command a user types at the repository's root (`npm run example:…`), running in a process group of its own. */
export interface CommandProcess {
  child: ChildProcess;
  /** Every stdout and stderr line so far, in order. */
  output: string[];
  /** Resolves with the first line so far or to come that matches; rejects on timeout or if the command exits first. */
  waitForLine(match: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  /** SIGKILL to the whole group (npm, its shell and the app), and wait for the exit. */
  kill(): Promise<void>;
}

/**
 * Runs `npm run <script> [-- args]` at the repository's root, exactly as its README tells a user to, with `env`
 * added to the environment. The group is killed by `kill()`; call it in `afterAll` whatever happened.
 */
export function runRootScript(script: string, args: string[], env: Record<string, string>): CommandProcess {
  const child = spawn('npm', ['run', '--silent', script, ...(args.length > 0 ? ['--', ...args] : [])], {
    cwd: repositoryRoot(),
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  const output: string[] = [];
  const listeners = new Set<(line: string) => void>();
  const onLine = (line: string) => {
    output.push(line);
    for (const listener of listeners) listener(line);
  };
  createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', onLine);
  createInterface({ input: child.stderr as NodeJS.ReadableStream }).on('line', onLine);
  const exited = () => child.exitCode !== null || child.signalCode !== null;

  const waitForLine = (match: RegExp, timeoutMs = 30_000) =>
    new Promise<RegExpMatchArray>((resolve, reject) => {
      for (const line of output) {
        const found = line.match(match);
        if (found) return resolve(found);
      }
      const done = (error?: Error, found?: RegExpMatchArray) => {
        clearTimeout(timer);
        listeners.delete(listener);
        child.off('exit', onExit);
        if (error) reject(error);
        else resolve(found as RegExpMatchArray);
      };
      const listener = (line: string) => {
        const found = line.match(match);
        if (found) done(undefined, found);
      };
      const onExit = (code: number | null, signal: string | null) =>
        done(
          new Error(
            `npm run ${script} exited (${code ?? signal}) before printing ${match}:\n${output.join('\n')}`,
          ),
        );
      const timer = setTimeout(
        () =>
          done(
            new Error(
              `npm run ${script}: no line matching ${match} within ${timeoutMs}ms:\n${output.join('\n')}`,
            ),
          ),
        timeoutMs,
      );
      listeners.add(listener);
      child.once('exit', onExit);
      if (exited()) onExit(child.exitCode, child.signalCode);
    });

  const kill = () =>
    new Promise<void>((resolve) => {
      if (exited()) return resolve();
      child.once('exit', () => resolve());
      try {
        process.kill(-(child.pid as number), 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    });

  return { child, output, waitForLine, kill };
}

/** Runs `npm run <script> [-- args]` at the root to its end; resolves with its exit code and output lines. */
export async function runRootScriptToEnd(
  script: string,
  args: string[],
  env: Record<string, string>,
  timeoutMs = 60_000,
): Promise<{ code: number | null; output: string[] }> {
  const command = runRootScript(script, args, env);
  const timer = setTimeout(() => void command.kill(), timeoutMs);
  const code = await new Promise<number | null>((resolve) => {
    if (command.child.exitCode !== null) return resolve(command.child.exitCode);
    command.child.once('exit', (exitCode) => resolve(exitCode));
  });
  clearTimeout(timer);
  // The readline interfaces may still hold the last lines: let them drain.
  await new Promise((resolve) => setImmediate(resolve));
  return { code, output: command.output };
}
