import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { freePort, type PrivateRedis, startRedis } from './servers';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function cli(port: number, ...args: string[]): Promise<string> {
  const { stdout } = await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args]);
  return stdout.trim();
}

async function waitFor(check: () => Promise<boolean>, what: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** `redis-cli` prints a map as alternating lines: field, value. */
function fields(reply: string): Map<string, string> {
  const lines = reply.split('\n');
  const map = new Map<string, string>();
  for (let i = 0; i + 1 < lines.length; i += 2) map.set(lines[i] as string, lines[i + 1] as string);
  return map;
}

/** One primary, one replica and a few Sentinels monitoring them, all from the system `redis-server`. */
export interface PrivateRedisSentinelSet {
  /** The name the Sentinels monitor the primary under (`new Redis({ sentinels, name })`). */
  name: string;
  primary: PrivateRedis;
  /** The first of `replicas`. */
  replica: PrivateRedis;
  replicas: PrivateRedis[];
  sentinels: { host: string; port: number }[];
  /** The address the Sentinels give for the primary now (`SENTINEL GET-MASTER-ADDR-BY-NAME`), from the first that answers. */
  primaryPort(): Promise<number | undefined>;
  /**
   * Resolves once every Sentinel names the same primary, one of `ports`, and it answers as a master; resolves to its
   * port. Rejects after `timeoutMs`.
   */
  waitForPrimary(ports: number[], timeoutMs?: number): Promise<number>;
  /** `redis-cli` against the `index`th Sentinel. */
  sentinelCli(index: number, ...args: string[]): Promise<string>;
  /** SIGCONT then SIGKILL to every process, temporary directories removed. Also done at process exit. */
  stop(): Promise<void>;
}

export interface SentinelSetOptions {
  /** Replicas of the primary. Default 1. */
  replicas?: number;
  /** Default 3. */
  sentinels?: number;
  /** Sentinels that must agree the primary is down. Default: a majority. */
  quorum?: number;
  /** `down-after-milliseconds`: how long a silent primary takes to be seen as down. Default 1000. */
  downAfterMs?: number;
  /** `failover-timeout`. Default 10000. */
  failoverTimeoutMs?: number;
}

/**
 * Starts a primary and a replica (`startRedis`) and `sentinels` Sentinels (`redis-server <conf> --sentinel`, each
 * with a writable config file of its own in a temporary directory), and resolves once every Sentinel knows the
 * replica and the other Sentinels, so that a failover can start as soon as the primary is down.
 */
export async function startRedisSentinelSet(
  options: SentinelSetOptions = {},
): Promise<PrivateRedisSentinelSet> {
  const count = options.sentinels ?? 3;
  const replicaCount = options.replicas ?? 1;
  const quorum = options.quorum ?? Math.floor(count / 2) + 1;
  const downAfterMs = options.downAfterMs ?? 1000;
  const failoverTimeoutMs = options.failoverTimeoutMs ?? 10_000;
  const name = 'oncely-primary';
  const dir = mkdtempSync(join(tmpdir(), 'oncely-sentinel-'));
  const children: ChildProcess[] = [];
  const dataNodes: PrivateRedis[] = [];
  /** Redis data-node pids, read from INFO, so that the exit hook can kill them too (startRedis does not expose them). */
  const dataPids = new Set<number>();
  const killAllNow = () => {
    for (const child of children) {
      if (child.exitCode !== null || child.signalCode !== null) continue;
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    }
    for (const pid of dataPids) {
      try {
        process.kill(pid, 'SIGCONT');
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', killAllNow);
  const rememberPid = async (node: PrivateRedis) => {
    const match = /process_id:(\d+)/.exec(await node.cli('info', 'server'));
    if (match) dataPids.add(Number(match[1]));
  };
  const stop = async () => {
    await Promise.all(
      children.map(
        (child) =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null || child.signalCode !== null) return resolve();
            child.once('exit', () => resolve());
            child.kill('SIGCONT');
            child.kill('SIGKILL');
          }),
      ),
    );
    await Promise.all(dataNodes.map((node) => node.stop()));
    killAllNow();
    process.off('exit', killAllNow);
  };
  try {
    const primary = await startRedis();
    dataNodes.push(primary);
    await rememberPid(primary);
    const replicas: PrivateRedis[] = [];
    for (let i = 0; i < replicaCount; i++) {
      const replica = await startRedis(['--replicaof', '127.0.0.1', String(primary.port)]);
      dataNodes.push(replica);
      replicas.push(replica);
      await rememberPid(replica);
      await waitFor(
        async () => (await replica.cli('info', 'replication')).includes('master_link_status:up'),
        'the replica to sync',
        15_000,
      );
    }
    const sentinels: { host: string; port: number }[] = [];
    for (let i = 0; i < count; i++) {
      const port = await freePort();
      const conf = join(dir, `sentinel-${i}.conf`);
      writeFileSync(
        conf,
        [
          `port ${port}`,
          'bind 127.0.0.1',
          `dir ${dir}`,
          'sentinel resolve-hostnames no',
          'sentinel announce-ip 127.0.0.1',
          `sentinel monitor ${name} 127.0.0.1 ${primary.port} ${quorum}`,
          `sentinel down-after-milliseconds ${name} ${downAfterMs}`,
          `sentinel failover-timeout ${name} ${failoverTimeoutMs}`,
          `sentinel parallel-syncs ${name} 1`,
          '',
        ].join('\n'),
      );
      children.push(spawn('redis-server', [conf, '--sentinel'], { stdio: 'ignore' }));
      sentinels.push({ host: '127.0.0.1', port });
    }
    // Sentinels find the replica from the primary's INFO and each other from hello messages (every 2 s).
    for (const sentinel of sentinels) {
      await waitFor(
        async () => {
          const master = fields(await cli(sentinel.port, 'sentinel', 'master', name));
          return (
            master.get('num-slaves') === String(replicaCount) &&
            master.get('num-other-sentinels') === String(count - 1)
          );
        },
        `sentinel on ${sentinel.port} to know the replica and the other sentinels`,
        20_000,
      );
    }
    const primaryPort = async () => {
      for (const sentinel of sentinels) {
        try {
          const reply = await cli(sentinel.port, 'sentinel', 'get-master-addr-by-name', name);
          const port = Number(reply.split('\n')[1]);
          if (port > 0) return port;
        } catch {
          // try the next one
        }
      }
      return undefined;
    };
    const waitForPrimary = async (ports: number[], timeoutMs = 30_000) => {
      let found = 0;
      await waitFor(
        async () => {
          const named = new Set<number>();
          for (const sentinel of sentinels) {
            const reply = await cli(sentinel.port, 'sentinel', 'get-master-addr-by-name', name);
            named.add(Number(reply.split('\n')[1]));
          }
          const [port] = [...named];
          if (named.size !== 1 || port === undefined || !ports.includes(port)) return false;
          found = port;
          return (await cli(port, 'role')).startsWith('master');
        },
        `every sentinel to name one of ${ports.join(', ')} the primary`,
        timeoutMs,
      );
      return found;
    };
    return {
      name,
      primary,
      replica: replicas[0] as PrivateRedis,
      replicas,
      sentinels,
      primaryPort,
      waitForPrimary,
      stop,
      sentinelCli: (index, ...args) => cli((sentinels[index] as { port: number }).port, ...args),
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
