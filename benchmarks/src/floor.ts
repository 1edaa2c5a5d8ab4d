// The floor: the least work any atomic Redis-backed idempotency layer must do, written by hand for one route, as
// the reference for what oncely's Redis path can cost (issue 15). One ioredis client with auto-pipelining; per
// request one script call that returns the stored record or reserves the key (`SET ... PX`), the handler, and one
// `SET ... PX` of status, headers and body before the response is sent. No fingerprint, no fencing token, no lease
// renewal, no wait mode, no problem+json, no checks on the key: everything oncely does beyond this is its cost.
import Redis from 'ioredis';

/** The floor's reserve-or-read script (also run by micro/redis-cpu.ts). */
export const RESERVE = `local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`;

const IN_PROGRESS = 'p';
const LOCK_MS = 30_000;
const TTL_MS = 86_400_000;
const NEWLINE = 0x0a;

type FloorClient = Redis & {
  floorReserveBuffer(key: string, marker: string, lockMs: number): Promise<Buffer | null>;
};

export interface FloorResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

export interface Floor {
  /** The stored response, 'in-progress', or undefined when this request reserved the key. */
  reserve(key: string): Promise<FloorResponse | 'in-progress' | undefined>;
  /** Stores the response (resolves once Redis has it). */
  store(key: string, response: FloorResponse): Promise<void>;
  close(): Promise<void>;
}

export async function openFloor(url: string, prefix: string): Promise<Floor> {
  const client = new Redis(url, { enableAutoPipelining: true }) as FloorClient;
  // defineCommand: EVALSHA, with EVAL once on NOSCRIPT.
  client.defineCommand('floorReserve', { numberOfKeys: 1, lua: RESERVE });
  await client.ping();
  return {
    async reserve(key) {
      const stored = await client.floorReserveBuffer(prefix + key, IN_PROGRESS, LOCK_MS);
      if (stored === null) return undefined;
      if (stored.length === 1 && stored[0] === IN_PROGRESS.charCodeAt(0)) return 'in-progress';
      // status '\n' headers JSON '\n' body
      const first = stored.indexOf(NEWLINE);
      const second = stored.indexOf(NEWLINE, first + 1);
      return {
        status: Number(stored.toString('latin1', 0, first)),
        headers: JSON.parse(stored.toString('utf8', first + 1, second)) as Record<string, string>,
        body: stored.subarray(second + 1),
      };
    },
    async store(key, response) {
      const head = Buffer.from(`${response.status}\n${JSON.stringify(response.headers)}\n`);
      await client.set(prefix + key, Buffer.concat([head, response.body]), 'PX', TTL_MS);
    },
    async close() {
      await client.quit();
    },
  };
}
