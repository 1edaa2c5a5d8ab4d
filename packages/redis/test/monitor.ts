import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import Redis from 'ioredis';

/**
 * The commands clients send to the server at `url` while `work` runs, by name and in order, as MONITOR shows them.
 * Left out: commands a script runs inside Redis (not round trips), and PINGs (node-redis pings idle connections).
 * Watched through `redis-cli monitor` in a child process, not ioredis' monitor mode, which can read a command line
 * that arrives together with MONITOR's own reply as a reply ("Command queue state error", a flaky CI run). A closing
 * ECHO with a unique text marks the end: MONITOR delivers in order, so once it shows, so has the rest.
 */
export async function commandsDuring(
  url: string,
  work: () => Promise<unknown>,
  onlyFrom?: Redis,
): Promise<string[]> {
  // Only this client's commands, when given: a store of an earlier test may still re-send a write in the background.
  const address =
    onlyFrom === undefined
      ? undefined
      : /addr=(\S+)/.exec(String(await onlyFrom.call('client', 'info')))?.[1];
  // Connected before MONITOR starts, so its own handshake is not in the list.
  const marker = new Redis(url);
  await marker.ping();
  const end = `end-of-work-${randomUUID()}`;
  const commands: string[] = [];
  let child: ChildProcess | undefined;
  try {
    child = spawn('redis-cli', ['-u', url, 'monitor'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const monitor = child;
    let started!: () => void;
    let ended!: () => void;
    const ready = new Promise<void>((resolve) => {
      started = resolve;
    });
    const done = new Promise<void>((resolve) => {
      ended = resolve;
    });
    const exited = new Promise<never>((_resolve, reject) => {
      monitor.once('exit', (code) => reject(new Error(`redis-cli monitor exited (${code})`)));
    });
    exited.catch(() => {});
    createInterface({ input: monitor.stdout as NodeJS.ReadableStream }).on('line', (line) => {
      if (line === 'OK') return started();
      const match = /^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]*)"/.exec(line);
      if (match === null || match[1] === 'lua') return;
      if (line.includes(end)) return ended();
      if (address !== undefined && match[1] !== address) return;
      const name = String(match[2]).toLowerCase();
      if (name !== 'ping') commands.push(name);
    });
    await Promise.race([ready, exited]);
    await work();
    await marker.echo(end);
    await Promise.race([done, exited]);
    return commands;
  } finally {
    child?.kill();
    marker.disconnect();
  }
}

/** `commandsDuring`, counted by name. */
export async function commandCounts(
  url: string,
  work: () => Promise<unknown>,
): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const name of await commandsDuring(url, work)) counts[name] = (counts[name] ?? 0) + 1;
  return counts;
}
