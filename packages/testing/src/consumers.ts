import type { ChildProcess } from 'node:child_process';
import { currentIdempotency } from '@oncely/core';
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

/** What `resumingWork()` saw on each delivery. */
export interface ResumingDelivery {
  /** What step `a` returned. */
  a: unknown;
  /** `keyFor('a')`. */
  keyFor: string;
  /** The context's `db`. */
  db: unknown;
}

/**
 * A consumer's work for the steps cases: through `currentIdempotency()`, runs step `a` (counted, returning
 * `{ n }`), throws on the first delivery, and on a later one runs step `b` (counted, returning nothing). Counts
 * deliveries and each step's runs, and keeps what each delivery saw. Throws when there is no context.
 */
export function resumingWork(): {
  work: () => Promise<{ a: unknown }>;
  runs: { deliveries: number; a: number; b: number };
  seen: ResumingDelivery[];
} {
  const runs = { deliveries: 0, a: 0, b: 0 };
  const seen: ResumingDelivery[] = [];
  const work = async (): Promise<{ a: unknown }> => {
    const delivery = ++runs.deliveries;
    await sleep(1);
    const context = currentIdempotency();
    if (context === undefined) throw new Error('currentIdempotency() is undefined in the work');
    const a = await context.step('a', () => ({ n: ++runs.a }));
    seen.push({ a, keyFor: context.keyFor('a'), db: context.db });
    if (delivery === 1) throw new Error('failed after step a');
    await context.step('b', async () => {
      runs.b++;
    });
    return { a };
  };
  return { work, runs, seen };
}
