import { type ChildProcess, execFile, spawn } from 'node:child_process';
import {
  cpSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import { freePort, type PrivateRedis, signal, waitFor } from './servers';

const run = promisify(execFile);

/** A MariaDB (or MySQL) binary: the first of `names` on PATH or in /usr/sbin, where Debian puts the server. */
export function mariadbBinary(...names: string[]): string {
  for (const name of names) {
    for (const dir of [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin']) {
      if (dir !== '' && existsSync(join(dir, name))) return join(dir, name);
    }
  }
  throw new Error(`none of ${names.join(', ')} is on PATH or in /usr/sbin`);
}

/**
 * Waits (synchronously, at most 2 s) until every thread of `pid` is stopped or running again, as Linux reports it
 * in /proc: a signal reaches a busy multi-threaded process a moment after kill() returns, and a test that sends a
 * query right after pause() must find it hung.
 */
function settle(pid: number, stopped: boolean): void {
  const deadline = Date.now() + 2000;
  const wait = new Int32Array(new SharedArrayBuffer(4));
  while (Date.now() < deadline) {
    let states: string[];
    try {
      states = readdirSync(`/proc/${pid}/task`).map((task) => {
        const stat = readFileSync(`/proc/${pid}/task/${task}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      });
    } catch {
      return; // gone, or not Linux
    }
    if (states.every((state) => (state === 'T') === stopped)) return;
    Atomics.wait(wait, 0, 0, 5);
  }
}

/**
 * A MariaDB server of the test's own, from the system binaries: to kill (SIGKILL: its clients see their connections
 * end, and the restart runs crash recovery, keeping every committed transaction), pause (SIGSTOP of its one process:
 * the kernel still accepts connections, nothing answers), or restart on the same port and data directory.
 */
export interface PrivateMariadb extends Omit<PrivateRedis, 'url' | 'cli' | 'stop'> {
  /** `mysql://root@127.0.0.1:<port>/test`: root without password, database `test`. */
  url: string;
  /** Runs SQL through the `mariadb` client as root, in database `test`; resolves with its tab-separated output. */
  sql(statement: string): Promise<string>;
  /** Stops the server whatever its state and removes its directory. Also done at process exit. */
  stop(): Promise<void>;
}

// Small and unsafe on purpose: a throwaway server that must start in about a second. No binary log, no
// performance_schema, a 16 MB buffer pool and 4 MB redo log; commits reach the OS (a SIGKILL loses none) unsynced.
const LEAN = [
  '--skip-name-resolve',
  '--skip-log-bin',
  '--performance-schema=OFF',
  '--innodb-buffer-pool-size=16M',
  '--innodb-log-file-size=4M',
];

/**
 * A data directory fresh from mariadb-install-db, made once per server binary and user and kept in the temporary
 * directory: installing takes seconds (most of a test file's time), copying 20 MB does not. Built aside and renamed
 * into place, so that a directory under the final name is complete, whoever of several processes built it.
 */
async function template(user: string[]): Promise<string> {
  const server = mariadbBinary('mariadbd', 'mysqld');
  const { mtimeMs, size } = statSync(server);
  const final = join(
    tmpdir(),
    `oncely-mariadb-template-${process.getuid?.() ?? 0}-${size}-${Math.floor(mtimeMs)}`,
  );
  if (existsSync(join(final, 'data'))) return final;
  const building = mkdtempSync(`${final}.building-`);
  try {
    await run(
      mariadbBinary('mariadb-install-db', 'mysql_install_db'),
      [
        '--no-defaults',
        `--datadir=${join(building, 'data')}`,
        '--auth-root-authentication-method=normal',
        '--skip-test-db',
        ...LEAN,
        ...user,
      ],
      { cwd: building },
    );
    renameSync(building, final);
  } catch (error) {
    rmSync(building, { recursive: true, force: true });
    // Another process got there first: its directory is as good.
    if (!existsSync(join(final, 'data'))) throw error;
  }
  return final;
}

/**
 * Starts a MariaDB server in a fresh temporary directory (a copy of mariadb-install-db's, root without password
 * from 127.0.0.1), listening on a free port of 127.0.0.1 and a socket in that directory, with a database `test`. As root,
 * runs it as root (`--user=root`: mariadbd refuses root otherwise).
 */
export async function startMariadbServer(): Promise<PrivateMariadb> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'oncely-mariadb-'));
  const data = join(dir, 'data');
  const socket = join(dir, 'mysqld.sock');
  const user = process.getuid?.() === 0 ? ['--user=root'] : [];
  const client = mariadbBinary('mariadb', 'mysql');
  let child: ChildProcess | undefined;
  const cleanupAtExit = () => {
    // Synchronous, best effort: the server dies with SIGKILL, and the directory goes.
    const pid = child?.pid;
    if (pid !== undefined && child?.exitCode === null && child.signalCode === null) {
      signal(pid, 'SIGCONT');
      signal(pid, 'SIGKILL');
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanupAtExit);
  const sql = async (statement: string, database = 'test') => {
    const { stdout } = await run(client, [
      '--no-defaults',
      '-h127.0.0.1',
      `-P${port}`,
      '-uroot',
      '--batch',
      '--skip-column-names',
      '-e',
      statement,
      database,
    ]);
    return stdout.trim();
  };
  const start = async () => {
    child = spawn(
      mariadbBinary('mariadbd', 'mysqld'),
      [
        '--no-defaults',
        `--datadir=${data}`,
        `--port=${port}`,
        '--bind-address=127.0.0.1',
        `--socket=${socket}`,
        `--pid-file=${join(dir, 'mysqld.pid')}`,
        `--log-error=${join(dir, 'error.log')}`,
        '--innodb-flush-log-at-trx-commit=2',
        '--innodb-doublewrite=0',
        '--character-set-server=utf8mb4',
        ...LEAN,
        ...user,
      ],
      { cwd: dir, stdio: 'ignore' },
    );
    const started = child;
    await waitFor(async () => {
      if (started.exitCode !== null || started.signalCode !== null) {
        throw new Error(`mariadbd on ${port} exited (see ${join(dir, 'error.log')})`);
      }
      await sql('SELECT 1', 'mysql');
      return true;
    }, `mariadbd on ${port}`);
  };
  const killed = () =>
    new Promise<void>((resolve) => {
      const server = child;
      if (server === undefined || server.exitCode !== null || server.signalCode !== null) return resolve();
      server.once('exit', () => resolve());
      signal(server.pid as number, 'SIGCONT');
      signal(server.pid as number, 'SIGKILL');
    });
  try {
    cpSync(join(await template(user), 'data'), data, { recursive: true });
    await start();
    await sql('CREATE DATABASE IF NOT EXISTS test', 'mysql');
  } catch (error) {
    await killed();
    process.off('exit', cleanupAtExit);
    cleanupAtExit();
    throw error;
  }
  return {
    port,
    url: `mysql://root@127.0.0.1:${port}/test`,
    kill: killed,
    restart: start,
    pause: () => {
      if (child?.pid === undefined) return;
      signal(child.pid, 'SIGSTOP');
      settle(child.pid, true);
    },
    resume: () => {
      if (child?.pid === undefined) return;
      signal(child.pid, 'SIGCONT');
      settle(child.pid, false);
    },
    sql: (statement) => sql(statement),
    stop: async () => {
      await killed();
      process.off('exit', cleanupAtExit);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
