import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
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

export async function waitFor(
  check: () => Promise<boolean>,
  what: string,
  timeoutMs = 15_000,
): Promise<void> {
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

/** The newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), where initdb and postgres are not on PATH. */
function debianPostgresBin(): string | undefined {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, 'bin', 'initdb')))
    .sort((a, b) => Number.parseFloat(b) - Number.parseFloat(a));
  return versions[0] === undefined ? undefined : join(root, versions[0], 'bin');
}

/** A PostgreSQL binary: from PATH if it is there, else from Debian's versioned directory. */
export function postgresBinary(name: 'initdb' | 'postgres' | 'pg_isready'): string {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir !== '' && existsSync(join(dir, name))) return join(dir, name);
  }
  const dir = debianPostgresBin();
  if (dir !== undefined) return join(dir, name);
  throw new Error(`${name} is neither on PATH nor in /usr/lib/postgresql/*/bin`);
}

/** The children of a process (Linux: from /proc), e.g. the backends of a postmaster. */
function childrenOf(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) children.push(Number(entry));
    } catch {
      // the process ended while we looked
    }
  }
  return children;
}

export function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // already gone
  }
}

/** A PostgreSQL server of the test's own, from the system binaries: to kill, pause, or restart. */
export interface PrivatePostgres {
  port: number;
  /** `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication, loopback only). */
  url: string;
  /**
   * Immediate stop: SIGQUIT to the postmaster, which is what `pg_ctl stop -m immediate` sends. Every backend exits
   * at once (their clients see the connection end), nothing is checkpointed, and the next start runs crash
   * recovery, as after a crash. Not SIGKILL of the postmaster alone: its backends would keep serving their open
   * connections, and hold the shared memory that keeps a new postmaster from starting.
   */
  kill(): Promise<void>;
  /** Starts it again on the same port and data directory (after kill). */
  restart(): Promise<void>;
  /** SIGSTOP to the postmaster, then to its children (backends included): connections stay open, nothing answers. */
  pause(): void;
  /** SIGCONT to all of them. */
  resume(): void;
  /** Stops the server whatever its state and removes its directory. Also done at process exit. */
  stop(): Promise<void>;
}

/**
 * Starts a PostgreSQL server in a fresh temporary directory (initdb, trust authentication, fsync off), listening on
 * a free port of 127.0.0.1 and a socket in that directory. As root, runs it as the `postgres` user (initdb and
 * postgres refuse root).
 */
export async function startPostgres(): Promise<PrivatePostgres> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'oncely-pg-'));
  const data = join(dir, 'data');
  let owner: { uid: number; gid: number } | undefined;
  let child: ChildProcess | undefined;
  let paused: number[] = [];
  const cleanupAtExit = () => {
    // Synchronous, best effort: the server's processes die with SIGKILL, and the directory goes.
    const pid = child?.pid;
    if (pid !== undefined && child?.exitCode === null && child.signalCode === null) {
      for (const p of [pid, ...childrenOf(pid)]) {
        signal(p, 'SIGCONT');
        signal(p, 'SIGKILL');
      }
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanupAtExit);
  try {
    if (process.getuid?.() === 0) {
      const { stdout } = await run('id', ['-u', 'postgres']);
      const { stdout: group } = await run('id', ['-g', 'postgres']);
      owner = { uid: Number(stdout.trim()), gid: Number(group.trim()) };
      chownSync(dir, owner.uid, owner.gid);
    }
    await run(
      postgresBinary('initdb'),
      ['-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync', '--no-instructions'],
      { ...owner, cwd: dir },
    );
  } catch (error) {
    process.off('exit', cleanupAtExit);
    cleanupAtExit();
    throw error;
  }
  const start = async () => {
    child = spawn(
      postgresBinary('postgres'),
      [
        '-D',
        data,
        '-p',
        String(port),
        '-k',
        dir,
        '-c',
        'listen_addresses=127.0.0.1',
        '-c',
        'fsync=off',
        '-c',
        'full_page_writes=off',
      ],
      { ...owner, cwd: dir, stdio: 'ignore' },
    );
    const started = child;
    await waitFor(async () => {
      if (started.exitCode !== null || started.signalCode !== null)
        throw new Error(`postgres on ${port} exited`);
      await run(postgresBinary('pg_isready'), ['-q', '-h', '127.0.0.1', '-p', String(port)]);
      return true;
    }, `postgres on ${port}`);
  };
  const exited = (how: NodeJS.Signals) =>
    new Promise<void>((resolve) => {
      const postmaster = child;
      if (postmaster === undefined || postmaster.exitCode !== null || postmaster.signalCode !== null)
        return resolve();
      const pid = postmaster.pid as number;
      // The postmaster exits once its children have; SIGKILL them all if it has not within 10 s.
      const timer = setTimeout(() => {
        for (const p of [...childrenOf(pid), pid]) signal(p, 'SIGKILL');
      }, 10_000);
      postmaster.once('exit', () => {
        clearTimeout(timer);
        resolve();
      });
      for (const p of [pid, ...paused]) signal(p, 'SIGCONT');
      paused = [];
      signal(pid, how);
    });
  try {
    await start();
  } catch (error) {
    await exited('SIGKILL');
    process.off('exit', cleanupAtExit);
    cleanupAtExit();
    throw error;
  }
  return {
    port,
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    kill: () => exited('SIGQUIT'),
    restart: start,
    pause: () => {
      const pid = child?.pid;
      if (pid === undefined) return;
      // The postmaster first, so that it forks no new backend while we stop the ones there are.
      signal(pid, 'SIGSTOP');
      paused = childrenOf(pid);
      for (const p of paused) signal(p, 'SIGSTOP');
    },
    resume: () => {
      const pid = child?.pid;
      for (const p of paused) signal(p, 'SIGCONT');
      paused = [];
      if (pid !== undefined) signal(pid, 'SIGCONT');
    },
    stop: async () => {
      await exited('SIGQUIT');
      process.off('exit', cleanupAtExit);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
