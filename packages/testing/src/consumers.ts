import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it is true; fails with `what` after `timeoutMs`. */
export async function waitUntil(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(25);
  }
  throw new Error(`timed out after ${timeoutMs}ms waiting for ${what}`);
}

/** A consumer in a process of its own, run from TypeScript sources (as startAppProcess runs an app). */
export interface ConsumerProcess {
  pid: number;
  child: ChildProcess;
  /** SIGKILL, and wait for the exit: the process gets no chance to ack, nack or close anything. */
  kill(): Promise<void>;
}

/** Starts `script`; resolves once it prints the line `ready` (it must, once it consumes). */
export function startConsumerProcess(script: string, env: Record<string, string>): Promise<ConsumerProcess> {
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
      reject(new Error(`${script} was not ready within 20s`));
    }, 20_000);
    const early = (code: number | null, signal: string | null) =>
      reject(new Error(`${script} exited early (${code ?? signal})`));
    child.once('exit', early);
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).once('line', (line) => {
      clearTimeout(timer);
      child.off('exit', early);
      if (line.trim() === 'ready') resolve({ pid: child.pid as number, child, kill });
      else reject(new Error(`${script} printed ${JSON.stringify(line)} instead of ready`));
    });
  });
}
