// CPU time of a process (user + system, every thread), read from /proc around a measured window: a steadier
// measure than requests/s on a shared machine, where another process taking a core moves requests/s by ±30% but
// moves the CPU each request costs much less. Linux only; elsewhere every reading is undefined.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import Redis from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';

/** Clock ticks per second of /proc's utime and stime (100 on Linux, read once). */
const TICKS_PER_SECOND = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** Fields of /proc/<pid>/stat after the command name (which may hold spaces, hence the last ')'). */
function statFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) the process has used so far, or undefined when /proc cannot tell. */
export function cpuSeconds(pid: number): number | undefined {
  const fields = statFields(pid);
  if (fields === undefined) return undefined;
  // utime and stime are fields 14 and 15 of stat, 12 and 13 after the state (field 3).
  return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND;
}

/** The processes that make a store server: one pid (Redis), or a parent and its children (PostgreSQL). */
export interface StoreProcesses {
  /** What is measured, for the report: 'redis-server 1234', 'postgres 567 and its children'. */
  label: string;
  /** CPU seconds of every process of the server now. */
  read(): number | undefined;
}

export async function redisProcesses(url: string): Promise<StoreProcesses | undefined> {
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await client.connect();
    const pid = Number(/process_id:(\d+)/.exec(await client.info('server'))?.[1]);
    // Only a server on this machine, in this pid namespace, can be read.
    if (!Number.isInteger(pid) || cpuSeconds(pid) === undefined) return undefined;
    return { label: `redis-server ${pid}`, read: () => cpuSeconds(pid) };
  } catch {
    return undefined;
  } finally {
    client.disconnect();
  }
}

/** mysqld or mariadbd: one process (its threads are counted with it), found through its pid file. */
export async function mysqlProcesses(url: string): Promise<StoreProcesses | undefined> {
  try {
    const connection = await mysql.createConnection({ uri: url, connectTimeout: 2_000 });
    let file: string;
    try {
      const [rows] = await connection.query('SELECT @@pid_file AS file');
      file = String((rows as { file: string }[])[0]?.file);
    } finally {
      await connection.end();
    }
    const pid = Number(readFileSync(file, 'utf8').trim());
    if (!Number.isInteger(pid) || cpuSeconds(pid) === undefined) return undefined;
    return { label: `mysqld ${pid}`, read: () => cpuSeconds(pid) };
  } catch {
    return undefined;
  }
}

export async function postgresProcesses(url: string): Promise<StoreProcesses | undefined> {
  const client = new pg.Client({ connectionString: url });
  try {
    await client.connect();
    const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const backend = rows[0]?.pid;
    const postmaster = backend === undefined ? undefined : Number(statFields(backend)?.[1]);
    if (postmaster === undefined || !Number.isInteger(postmaster) || cpuSeconds(postmaster) === undefined)
      return undefined;
    return {
      label: `postgres ${postmaster} and its children`,
      // Every backend and background process: a backend that exits within the window loses its time (the pools
      // here keep theirs open), one that starts within it counts whole.
      read: () => {
        let total = cpuSeconds(postmaster);
        if (total === undefined) return undefined;
        for (const entry of readdirSync('/proc')) {
          const pid = Number(entry);
          if (!Number.isInteger(pid)) continue;
          const fields = statFields(pid);
          if (fields !== undefined && Number(fields[1]) === postmaster)
            total += (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND;
        }
        return total;
      },
    };
  } catch {
    return undefined;
  } finally {
    await client.end().catch(() => {});
  }
}

/** µs of CPU per request over a window, or undefined when either reading is missing. */
export function perRequestUs(
  before: number | undefined,
  after: number | undefined,
  requests: number,
): number | undefined {
  if (before === undefined || after === undefined || requests <= 0) return undefined;
  return ((after - before) * 1e6) / requests;
}
