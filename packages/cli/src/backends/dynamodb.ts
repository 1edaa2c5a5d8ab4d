import type { AttributeValue, DynamoDBClient, ScanCommandInput } from '@aws-sdk/client-dynamodb';
import type { StoredResponse } from '@oncely/core';
import {
  CliError,
  EXIT,
  guarded,
  isCliError,
  isStoreOperationError,
  loadDriver,
  unreachable,
  usageError,
  within,
} from '../errors';
import { noRecords, recordView } from '../records';
import type { Backend, BackendFactory, ListPage, RecordView, Stats } from './types';

type Item = Record<string, AttributeValue>;

/** DynamoDB's size of an attribute value, as it counts it against the 400 KB item limit (numbers: an upper bound). */
function valueBytes(value: AttributeValue): number {
  if (value.S !== undefined) return Buffer.byteLength(value.S);
  if (value.N !== undefined) return Math.ceil(value.N.length / 2) + 1;
  if (value.B !== undefined) return value.B.byteLength;
  if (value.M !== undefined) return 3 + itemBytes(value.M);
  if (value.L !== undefined) return 3 + value.L.reduce((sum, v) => sum + 1 + valueBytes(v), 0);
  if (value.SS !== undefined) return value.SS.reduce((sum, v) => sum + Buffer.byteLength(v), 0);
  if (value.NS !== undefined) return value.NS.reduce((sum, v) => sum + Math.ceil(v.length / 2) + 1, 0);
  if (value.BS !== undefined) return value.BS.reduce((sum, v) => sum + v.byteLength, 0);
  return 1;
}

function itemBytes(item: Item): number {
  let bytes = 0;
  for (const [name, value] of Object.entries(item)) bytes += Buffer.byteLength(name) + valueBytes(value);
  return bytes;
}

/** A list cursor: the Scan's LastEvaluatedKey, as base64url JSON. */
const encodeCursor = (key: Item) => Buffer.from(JSON.stringify(key)).toString('base64url');
function decodeCursor(cursor: string): Item {
  try {
    const key = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (key !== null && typeof key === 'object') return key as Item;
  } catch {}
  throw usageError(`--cursor ${JSON.stringify(cursor)} is not a cursor list printed`);
}

/**
 * DynamoDB through the store's own code: inspect and delete are the store's `get` and `delete` (its key, its decoder,
 * its chunked bodies), list and stats a `Scan` of the table decoded with the store's item decoder
 * (`@oncely/dynamodb/records`). The URL: `dynamodb://TABLE?region=..&endpoint=..&prefix=..&partitionKey=..`.
 */
export const openDynamoDB: BackendFactory = async (options) => {
  const sdk = await loadDriver('@aws-sdk/client-dynamodb', () => import('@aws-sdk/client-dynamodb'));
  const { DynamoDBStore } = await import('@oncely/dynamodb');
  const layout = await import('@oncely/dynamodb/records');
  const { url, env, connectTimeoutMs } = options;
  const inUrl = decodeURIComponent(url.hostname || url.pathname.replace(/^\/+/, ''));
  // --table names the table as it does for SQL; a URL naming another one is a mistake, not a choice to make silently.
  if (options.table !== undefined && inUrl !== '' && options.table !== inUrl) {
    throw usageError(`--table ${options.table} and the URL's table ${inUrl} differ: give the table once`);
  }
  const table = options.table ?? inUrl;
  if (table === '') {
    throw usageError('a DynamoDB URL names its table (dynamodb://TABLE?region=...), or give --table TABLE');
  }
  const param = (name: string) => url.searchParams.get(name) ?? undefined;
  const prefix = options.prefix ?? param('prefix') ?? layout.DEFAULT_PREFIX;
  const partitionKey = param('partitionKey') ?? layout.DEFAULT_PARTITION_KEY;
  const endpoint = param('endpoint') ?? env.AWS_ENDPOINT_URL_DYNAMODB ?? env.AWS_ENDPOINT_URL;
  const region = param('region') ?? env.AWS_REGION ?? env.AWS_DEFAULT_REGION;
  if (region === undefined) throw usageError('a DynamoDB URL needs a region: ?region=... or $AWS_REGION');
  const accessKeyId = env.AWS_ACCESS_KEY_ID;
  const secretAccessKey = env.AWS_SECRET_ACCESS_KEY;
  const client: DynamoDBClient = new sdk.DynamoDBClient({
    region,
    ...(endpoint === undefined ? {} : { endpoint }),
    // Credentials from the given environment when it has them, else the SDK's own chain (profiles, roles).
    ...(accessKeyId !== undefined && secretAccessKey !== undefined
      ? {
          credentials: {
            accessKeyId,
            secretAccessKey,
            ...(env.AWS_SESSION_TOKEN === undefined ? {} : { sessionToken: env.AWS_SESSION_TOKEN }),
          },
        }
      : {}),
    maxAttempts: 1,
    requestHandler: {
      connectionTimeout: connectTimeoutMs,
      requestTimeout: connectTimeoutMs,
      throwOnRequestTimeout: true,
    },
  });
  const where = `dynamodb table ${table} (${endpoint ?? region})`;
  try {
    await within(client.send(new sdk.DescribeTableCommand({ TableName: table })), connectTimeoutMs, where);
  } catch (error) {
    client.destroy();
    if (isCliError(error)) throw error;
    // The store answered: the table is what is wrong, as a missing SQL table is.
    if (error instanceof Error && error.name === 'ResourceNotFoundException') {
      throw new CliError(
        EXIT.unknownLayout,
        `no table ${table} in dynamodb ${endpoint ?? region} (${error.message}): check the table in the URL (dynamodb://TABLE?region=...), its region and endpoint, or create it with the store's createTable() once`,
        { cause: error },
      );
    }
    throw unreachable(where, error);
  }
  const store = new DynamoDBStore({ client, tableName: table, prefix, partitionKey });

  const guard = guarded(where, isStoreOperationError);

  /** An item of the table as a view; undefined for a chunk item or an expired record; 'unknown' for another item. */
  function view(item: Item, now: number, scope: string | undefined): RecordView | 'unknown' | undefined {
    const pk = item[partitionKey]?.S;
    if (pk === undefined || !pk.startsWith(prefix) || layout.isChunkKey(prefix, pk)) return undefined;
    let parsed: ReturnType<typeof layout.parseItem>;
    try {
      parsed = layout.parseItem(item, pk);
    } catch (error) {
      if (isStoreOperationError(error)) return 'unknown';
      throw error;
    }
    const state = layout.stateAt(parsed, now);
    if (state === undefined) return undefined;
    const record = layout.recordOf(parsed, state);
    if (parsed.response !== undefined) {
      const response: StoredResponse = {
        ...parsed.response,
        body: parsed.response.body ?? new Uint8Array(0),
      };
      record.response = response;
    }
    const storeKey = pk.slice(prefix.length);
    const result = recordView(storeKey, `${table}/${pk}`, record, now, { bytes: itemBytes(item) });
    if (scope !== undefined && result.scope !== scope) return undefined;
    // A body split over chunk items: its size is the record's, its preview is not read for a list.
    if (parsed.chunks !== undefined && result.response !== undefined)
      result.response.bodyBytes = parsed.chunks.bytes;
    return result;
  }

  function scanInput(scope: string | undefined): ScanCommandInput {
    return {
      TableName: table,
      ConsistentRead: true,
      FilterExpression: 'begins_with(#pk, :prefix)',
      ExpressionAttributeNames: { '#pk': partitionKey },
      ExpressionAttributeValues: { ':prefix': { S: scope === undefined ? prefix : `${prefix}${scope} ` } },
    };
  }

  const backend: Backend = {
    description: `${where} prefix ${JSON.stringify(prefix)}`,

    async inspect(storeKey) {
      const location = `${table}/${prefix}${storeKey}`;
      const record = await guard(store.get(storeKey), location);
      return record === undefined ? undefined : recordView(storeKey, location, record, Date.now());
    },

    async delete(storeKey) {
      return guard(store.delete(storeKey), `${table}/${prefix}${storeKey}`);
    },

    async list({ limit, scope, inProgress, cursor }) {
      const page: ListPage = { records: [] };
      const unknown: string[] = [];
      let start = cursor === undefined ? undefined : decodeCursor(cursor);
      // Limit bounds the items a Scan call reads, before the filter: each call asks for what the page still lacks,
      // so a page never holds more than `limit` and its cursor is exactly where it stopped.
      do {
        const reply = await guard(
          client.send(
            new sdk.ScanCommand({
              ...scanInput(scope),
              Limit: limit - page.records.length,
              ...(start === undefined ? {} : { ExclusiveStartKey: start }),
            }),
          ),
          where,
        );
        const now = Date.now();
        for (const item of reply.Items ?? []) {
          const found = view(item, now, scope);
          if (found === 'unknown') unknown.push(`${table}/${item[partitionKey]?.S ?? '?'}`);
          else if (found !== undefined && (inProgress !== true || found.state === 'in_progress'))
            page.records.push(found);
        }
        start = reply.LastEvaluatedKey;
      } while (start !== undefined && page.records.length < limit);
      if (start !== undefined) page.cursor = encodeCursor(start);
      if (unknown.length > 0) page.unknown = unknown;
      return page;
    },

    async stats(onProgress) {
      const stats: Stats = { byState: noRecords(), records: 0, unknown: 0, bytes: 0 };
      let start: Item | undefined;
      let scanned = 0;
      do {
        const reply = await guard(
          client.send(
            new sdk.ScanCommand({
              ...scanInput(undefined),
              ...(start === undefined ? {} : { ExclusiveStartKey: start }),
            }),
          ),
          where,
        );
        const now = Date.now();
        for (const item of reply.Items ?? []) {
          const pk = item[partitionKey]?.S ?? '';
          // Chunk items hold a record's body: their bytes are the record's.
          if (layout.isChunkKey(prefix, pk)) {
            stats.bytes = (stats.bytes ?? 0) + itemBytes(item);
            continue;
          }
          const found = view(item, now, undefined);
          if (found === 'unknown') stats.unknown++;
          else if (found !== undefined) {
            stats.byState[found.state]++;
            stats.records++;
            stats.bytes = (stats.bytes ?? 0) + (found.bytes ?? 0);
          }
        }
        scanned += reply.ScannedCount ?? 0;
        onProgress?.(scanned);
        start = reply.LastEvaluatedKey;
      } while (start !== undefined);
      return stats;
    },

    async close() {
      client.destroy();
    },
  };
  return backend;
};
