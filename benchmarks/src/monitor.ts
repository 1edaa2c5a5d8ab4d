// Counts Redis commands with MONITOR, through `redis-cli monitor` in a child process (ioredis' monitor mode can
// trip over a line that arrives before it has switched, "Command queue state error"). Commands that a Lua script
// runs show as `[0 lua]`: they are not round trips and are not counted; only lines naming `marker` (a run's key
// prefix) are, so other clients of a shared Redis do not count either.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

export interface Monitor {
  count: number;
  stop(): void;
}

export function startMonitor(url: string, marker: string): Promise<Monitor> {
  const child = spawn('redis-cli', ['-u', url, 'monitor'], { stdio: ['ignore', 'pipe', 'ignore'] });
  const monitor: Monitor = { count: 0, stop: () => child.kill() };
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`redis-cli monitor exited (${code})`)));
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      if (line === 'OK') {
        resolve(monitor);
        return;
      }
      const source = /^\d+\.\d+ \[\d+ ([^\]]+)\]/.exec(line)?.[1];
      if (source !== undefined && source !== 'lua' && line.includes(marker)) monitor.count++;
    });
  });
}
