// ONCELY_BENCH_REDIS_REPLICA=1: a private primary with one replica of its own (system redis-server), for measuring
// what RedisStore's waitForReplicas costs. Stopped by the runner's cleanup, and killed at exit whatever happens.
import { type PrivateRedis, startRedis, waitUntil } from '@oncely/testing';

export interface PrimaryWithReplica {
  primary: PrivateRedis;
  replica: PrivateRedis;
  stop(): Promise<void>;
}

export async function startPrimaryWithReplica(): Promise<PrimaryWithReplica> {
  const nodes: PrivateRedis[] = [];
  const pids: number[] = [];
  const killAtExit = () => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGCONT');
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  };
  process.on('exit', killAtExit);
  const started = async (args: string[]) => {
    const node = await startRedis(args);
    nodes.push(node);
    const pid = /process_id:(\d+)/.exec(await node.cli('info', 'server'))?.[1];
    if (pid !== undefined) pids.push(Number(pid));
    return node;
  };
  const stop = async () => {
    await Promise.all(nodes.map((node) => node.stop()));
    process.off('exit', killAtExit);
  };
  try {
    const primary = await started([]);
    const replica = await started(['--replicaof', '127.0.0.1', String(primary.port)]);
    await waitUntil(
      async () => (await replica.cli('info', 'replication')).includes('master_link_status:up'),
      'the replica to sync',
    );
    return { primary, replica, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
