import type { Cluster, Redis, RedisOptions } from 'ioredis';
import {
  guarded,
  isCliError,
  isStoreOperationError,
  loadDriver,
  unreachable,
  usageError,
  within,
} from '../errors';
import { inScope, noRecords, recordView } from '../records';
import type { Backend, BackendFactory, ListPage, RecordView, Stats } from './types';

/** Keys one SCAN call is asked to look at (a hint to Redis: it bounds the work of one call, not the reply). */
const SCAN_COUNT = 500;
/** The SCAN calls one list page makes at most. */
const MAX_SCAN_CALLS = 100;
/** Records decoded at once (one script call each). */
const BATCH = 100;

/** A glob pattern matching `text` literally (SCAN MATCH). */
const literal = (text: string) => text.replace(/[*?[\]\\]/g, '\\$&');

function hostPort(text: string, fallbackPort: number): { host: string; port: number } {
  const at = text.lastIndexOf(':');
  if (at < 0) return { host: text, port: fallbackPort };
  return { host: text.slice(0, at).replace(/^\[|\]$/g, ''), port: Number(text.slice(at + 1)) };
}

/** A value under the prefix that is not a record (StoreOperationError from the store's decoder, or WRONGTYPE). */
function isLayoutError(error: unknown): boolean {
  return isStoreOperationError(error) || (error instanceof Error && error.message.startsWith('WRONGTYPE'));
}

/**
 * Redis, single node or Cluster, through ioredis and the store's own code: a record is read with the store's
 * `get` (its script and decoder), deleted with its `delete`, and found under the Redis key the store computes
 * (`@oncely/redis/records`), so that the command sees what the store sees.
 */
export const openRedis: BackendFactory = async (options) => {
  const ioredis = await loadDriver('ioredis', () => import('ioredis'));
  const { RedisStore } = await import('@oncely/redis');
  const records = await import('@oncely/redis/records');
  const { url, connectTimeoutMs } = options;
  const prefix = options.prefix ?? records.DEFAULT_PREFIX;
  const tls = url.protocol === 'rediss:' || url.searchParams.get('tls') === 'true';
  // Fail fast: no retries, no offline queue, a bound on every command, so an unreachable store never hangs.
  const redisOptions: RedisOptions = {
    lazyConnect: true,
    connectTimeout: connectTimeoutMs,
    commandTimeout: connectTimeoutMs,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
    ...(url.username === '' ? {} : { username: decodeURIComponent(url.username) }),
    ...(url.password === '' ? {} : { password: decodeURIComponent(url.password) }),
    ...(tls ? { tls: {} } : {}),
  };
  const Redis = (ioredis.default ?? ioredis) as unknown as typeof import('ioredis').default;
  let client: Redis | Cluster;
  let where: string;
  if (options.cluster) {
    const seeds = (options.nodes.length > 0 ? options.nodes : [url.host]).map((node) => hostPort(node, 6379));
    where = `redis cluster ${seeds.map((s) => `${s.host}:${s.port}`).join(',')}`;
    client = new Redis.Cluster(seeds, {
      lazyConnect: true,
      redisOptions,
      clusterRetryStrategy: () => null,
      enableOfflineQueue: false,
      slotsRefreshTimeout: connectTimeoutMs,
    });
  } else {
    const db = url.pathname.length > 1 ? Number(url.pathname.slice(1)) : 0;
    const host = url.hostname === '' ? '127.0.0.1' : url.hostname.replace(/^\[|\]$/g, '');
    const port = url.port === '' ? 6379 : Number(url.port);
    where = `redis ${host}:${port}${db === 0 ? '' : `/${db}`}`;
    client = new Redis({ ...redisOptions, host, port, db });
  }
  // connect() rejects with "Connection is closed"; the event has the reason (ECONNREFUSED, ENOTFOUND, NOAUTH).
  let connectionError: unknown;
  client.on('error', (error: unknown) => {
    connectionError = error;
  });
  const description = `${where} prefix ${JSON.stringify(prefix)}`;
  // A connection that failed is over already; disconnecting it again would leave ioredis's 2 s teardown timer.
  const disconnect = () => {
    if (client.status !== 'end') client.disconnect();
  };
  let offsetMs: number;
  try {
    await within(client.connect(), connectTimeoutMs, where);
    // Redis's clock, against which the store's times are read (a lease is on the server's clock).
    const [seconds, micros] = (await within(client.time(), connectTimeoutMs, where)) as [
      number | string,
      number | string,
    ];
    offsetMs = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000) - Date.now();
  } catch (error) {
    disconnect();
    throw isCliError(error) ? error : unreachable(where, connectionError ?? error);
  }
  const now = () => Date.now() + offsetMs;
  const store = new RedisStore({ client, prefix, coalesceWrites: false });
  const digestTags = records.usesDigestTags(prefix, options.cluster);

  /** The masters, in a stable order: a list cursor names one of them by its place. */
  const masters = (): Redis[] =>
    client instanceof Redis.Cluster
      ? client
          .nodes('master')
          .sort((a, b) =>
            `${a.options.host}:${a.options.port}`.localeCompare(`${b.options.host}:${b.options.port}`),
          )
      : [client as Redis];

  const guard = guarded(where, isLayoutError);

  /** The record under a Redis key SCAN found: a view, `undefined` (expired meanwhile, or another scope), or 'unknown'. */
  async function read(
    redisKey: string,
    scope: string | undefined,
  ): Promise<RecordView | 'unknown' | undefined> {
    const storeKey = records.storeKeyOf(prefix, redisKey, digestTags);
    if (storeKey === undefined || !inScope(storeKey, scope)) return undefined;
    try {
      const record = await store.get(storeKey);
      return record === undefined ? undefined : recordView(storeKey, redisKey, record, now());
    } catch (error) {
      if (isLayoutError(error)) return 'unknown';
      throw error;
    }
  }

  async function readAll(keys: string[], scope: string | undefined) {
    const out: (RecordView | 'unknown' | undefined)[] = [];
    for (let i = 0; i < keys.length; i += BATCH) {
      out.push(...(await Promise.all(keys.slice(i, i + BATCH).map((key) => read(key, scope)))));
    }
    return out;
  }

  /** MEMORY USAGE on the node that holds the key (a Cluster node answers MOVED for another's). */
  async function memoryUsage(redisKey: string): Promise<number | undefined> {
    for (const node of masters()) {
      const bytes = await node.call('MEMORY', 'USAGE', redisKey, 'SAMPLES', '0').catch(() => undefined);
      if (typeof bytes === 'number') return bytes;
    }
    return undefined;
  }

  const backend: Backend = {
    description,

    async inspect(storeKey) {
      const redisKey = records.redisKeyOf(prefix, storeKey, digestTags);
      const record = await guard(store.get(storeKey), redisKey);
      if (record === undefined) return undefined;
      const bytes = await guard(memoryUsage(redisKey), redisKey);
      return recordView(storeKey, redisKey, record, now(), bytes === undefined ? {} : { bytes });
    },

    async delete(storeKey) {
      return guard(store.delete(storeKey), records.redisKeyOf(prefix, storeKey, digestTags));
    },

    async list({ limit, scope, inProgress, cursor }) {
      // The cursor: which master, its SCAN cursor, and how many of that SCAN call's keys were already shown (a page
      // ends inside a call's reply; the next page calls SCAN with the same cursor again and skips them).
      let node = 0;
      let scan = '0';
      let skip = 0;
      if (cursor !== undefined) {
        const match = /^(\d+)\.(\d+)\.(\d+)$/.exec(cursor);
        if (match === null)
          throw usageError(`--cursor ${JSON.stringify(cursor)} is not a cursor list printed`);
        node = Number(match[1]);
        scan = match[2] as string;
        skip = Number(match[3]);
      }
      // Without digest tags a scope is a prefix of the Redis key, which SCAN can match by itself.
      const pattern = `${literal(prefix)}${scope !== undefined && !digestTags ? `${literal(scope)} ` : ''}*`;
      const page: ListPage = { records: [] };
      const unknown: string[] = [];
      const nodes = masters();
      // A page also ends after that many SCAN calls, full or not, so that a sparse prefix in a large keyspace
      // answers a page at a time rather than walking it all at once.
      for (let calls = 0; node < nodes.length; calls++) {
        if (calls === MAX_SCAN_CALLS) {
          page.cursor = `${node}.${scan}.0`;
          break;
        }
        const [next, keys] = await guard(
          (nodes[node] as Redis).scan(scan, 'MATCH', pattern, 'COUNT', SCAN_COUNT),
          where,
        );
        const views = await guard(readAll(keys.slice(skip), scope), where);
        for (let i = 0; i < views.length; i++) {
          if (page.records.length === limit) {
            page.cursor = `${node}.${scan}.${skip + i}`;
            if (unknown.length > 0) page.unknown = unknown;
            return page;
          }
          const view = views[i];
          if (view === 'unknown') unknown.push(keys[skip + i] as string);
          else if (view !== undefined && (inProgress !== true || view.state === 'in_progress'))
            page.records.push(view);
        }
        skip = 0;
        if (next === '0') {
          node++;
          scan = '0';
        } else scan = next;
        if (page.records.length === limit && node < nodes.length) {
          page.cursor = `${node}.${scan}.0`;
          break;
        }
      }
      if (unknown.length > 0) page.unknown = unknown;
      return page;
    },

    async stats(onProgress) {
      const stats: Stats = { byState: noRecords(), records: 0, unknown: 0, bytes: 0 };
      let scanned = 0;
      for (const node of masters()) {
        let scan = '0';
        do {
          const [next, keys] = await guard(
            node.scan(scan, 'MATCH', `${literal(prefix)}*`, 'COUNT', SCAN_COUNT),
            where,
          );
          scan = next;
          const [views, sizes] = await Promise.all([
            guard(readAll(keys, undefined), where),
            guard(node.pipeline(keys.map((key) => ['memory', 'usage', key, 'samples', '0'])).exec(), where),
          ]);
          views.forEach((view, i) => {
            if (view === undefined) return;
            if (view === 'unknown') {
              stats.unknown++;
              return;
            }
            stats.byState[view.state]++;
            stats.records++;
            const size = sizes?.[i]?.[1];
            if (typeof size === 'number') stats.bytes = (stats.bytes ?? 0) + size;
          });
          scanned += keys.length;
          onProgress?.(scanned);
        } while (scan !== '0');
      }
      return stats;
    },

    async close() {
      await store.close();
      await within(client.quit(), connectTimeoutMs, where).catch(disconnect);
    },
  };
  return backend;
};
