/**
 * The item layout of the DynamoDB store and its decoder, for tools that read the table themselves (the `oncely`
 * command's inspect, list and stats). An app does not need it.
 *
 * @module @oncely/dynamodb/records
 */
export {
  ATTR,
  endOf,
  type Item,
  type ParsedRecord,
  parseItem,
  recordOf,
  stateAt,
} from '../items';

/** The key prefix the store uses when it is given no `prefix`. */
export const DEFAULT_PREFIX = 'oncely:';
/** The partition key attribute the store uses when it is given no `partitionKey`. */
export const DEFAULT_PARTITION_KEY = 'pk';
/** The TTL attribute (epoch seconds, what DynamoDB's TTL deletion reads) used when the store is given no `ttlAttribute`. */
export const DEFAULT_TTL_ATTRIBUTE = 'ttl';

/**
 * The partition key of a chunk item (part of a body too large for its record's item): `<prefix>chunk:<chunk id>:<n>`,
 * the chunk id a random UUID per completion, so that a record key can only meet one by guessing that UUID.
 */
export function chunkKeyOf(prefix: string, id: string, index: number): string {
  return `${prefix}chunk:${id}:${index}`;
}

const CHUNK_KEY = /^chunk:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:\d+$/;

/** Whether a partition key under `prefix` is a chunk item's (`chunkKeyOf`) rather than a record's. */
export function isChunkKey(prefix: string, pk: string): boolean {
  return pk.startsWith(prefix) && CHUNK_KEY.test(pk.slice(prefix.length));
}
