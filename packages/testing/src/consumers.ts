import type { ChildProcess } from 'node:child_process';
import { spawnSource } from './processes';

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
export async function startConsumerProcess(
  script: string,
  env: Record<string, string>,
): Promise<ConsumerProcess> {
  const { child, kill, firstLine } = spawnSource(script, env);
  const line = await firstLine('was not ready');
  if (line.trim() !== 'ready') throw new Error(`${script} printed ${JSON.stringify(line)} instead of ready`);
  return { pid: child.pid as number, child, kill };
}
