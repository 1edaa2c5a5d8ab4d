import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A free TCP port on 127.0.0.1 (the OS picks it; the tiny reuse race is acceptable in tests). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

async function waitFor(check: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function redisCli(port: number, ...args: string[]): Promise<string> {
  const { stdout } = await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args]);
  return stdout.trim();
}

/** A redis-server of the test's own, from the system binary: to kill, pause, restart, or count commands on. */
export interface PrivateRedis {
  port: number;
  url: string;
  /** SIGKILL: the process dies at once, nothing flushed. */
  kill(): Promise<void>;
  /** Starts it again on the same port (after kill). */
  restart(): Promise<void>;
  /** SIGSTOP: the process hangs; connections stay open, nothing answers. */
  pause(): void;
  /** SIGCONT. */
  resume(): void;
  cli(...args: string[]): Promise<string>;
  stop(): Promise<void>;
}

export async function startRedis(extraArgs: string[] = []): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'oncely-redis-'));
  let child: ChildProcess | undefined;
  const start = async () => {
    child = spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        dir,
        ...extraArgs,
      ],
      { stdio: 'ignore' },
    );
    await waitFor(async () => (await redisCli(port, 'ping')) === 'PONG', `redis-server on ${port}`);
  };
  const killed = () =>
    new Promise<void>((resolve) => {
      if (child === undefined || child.exitCode !== null || child.signalCode !== null) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGKILL');
    });
  await start();
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    kill: killed,
    restart: start,
    pause: () => void child?.kill('SIGSTOP'),
    resume: () => void child?.kill('SIGCONT'),
    cli: (...args) => redisCli(port, ...args),
    stop: async () => {
      child?.kill('SIGCONT');
      await killed();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A Redis Cluster of `masters` nodes (no replicas) started from the system binary on free ports. */
export interface PrivateRedisCluster {
  nodes: { host: string; port: number }[];
  stop(): Promise<void>;
}

export async function startRedisCluster(masters = 3): Promise<PrivateRedisCluster> {
  const servers: PrivateRedis[] = [];
  try {
    for (let i = 0; i < masters; i++) {
      servers.push(
        await startRedis([
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          `nodes-${i}.conf`,
          '--cluster-node-timeout',
          '5000',
        ]),
      );
    }
    await run('redis-cli', [
      '--cluster',
      'create',
      ...servers.map((s) => `127.0.0.1:${s.port}`),
      '--cluster-replicas',
      '0',
      '--cluster-yes',
    ]);
    for (const server of servers) {
      await waitFor(
        async () => (await server.cli('cluster', 'info')).includes('cluster_state:ok'),
        `cluster on ${server.port}`,
      );
    }
  } catch (error) {
    await Promise.all(servers.map((s) => s.stop()));
    throw error;
  }
  return {
    nodes: servers.map((s) => ({ host: '127.0.0.1', port: s.port })),
    stop: async () => {
      await Promise.all(servers.map((s) => s.stop()));
    },
  };
}
