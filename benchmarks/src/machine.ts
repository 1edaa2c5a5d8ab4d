// What the numbers were measured on.
import { readFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import Redis from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';

export interface Machine {
  cpu: string;
  cores: number;
  memoryGiB: number;
  node: string;
  redis: string;
  postgres: string;
  /** MySQL or MariaDB: `VERSION()`, or 'unreachable'; absent from results saved before it was measured. */
  mysql?: string;
  os: string;
  loadBefore: string;
}

function cpuModel(): string {
  try {
    const match = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    if (match?.[1] !== undefined) return match[1].trim();
  } catch {
    // not Linux
  }
  return cpus()[0]?.model ?? 'unknown';
}

function osName(): string {
  try {
    const match = /^PRETTY_NAME="?([^"\n]+)"?$/m.exec(readFileSync('/etc/os-release', 'utf8'));
    if (match?.[1] !== undefined) return match[1];
  } catch {
    // not Linux
  }
  return process.platform;
}

export async function describeMachine(redisUrl: string, pgUrl: string, mysqlUrl: string): Promise<Machine> {
  let redis = 'unreachable';
  const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await client.connect();
    const info = await client.info('server');
    redis = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
  } catch {
    // reported as unreachable
  } finally {
    client.disconnect();
  }
  let postgres = 'unreachable';
  const pool = new pg.Pool({ connectionString: pgUrl, max: 1 });
  try {
    const { rows } = await pool.query<{ server_version: string }>('SHOW server_version');
    postgres = rows[0]?.server_version ?? 'unknown';
  } catch {
    // reported as unreachable
  } finally {
    await pool.end();
  }
  let mysqlVersion = 'unreachable';
  try {
    const connection = await mysql.createConnection({ uri: mysqlUrl, connectTimeout: 2_000 });
    try {
      const [rows] = await connection.query('SELECT VERSION() AS version');
      mysqlVersion = String((rows as { version: string }[])[0]?.version ?? 'unknown');
    } finally {
      await connection.end();
    }
  } catch {
    // reported as unreachable
  }
  return {
    cpu: cpuModel(),
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    redis,
    postgres,
    mysql: mysqlVersion,
    os: osName(),
    loadBefore: loadavg()
      .map((l) => l.toFixed(2))
      .join(' / '),
  };
}
