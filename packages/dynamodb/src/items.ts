import type { AttributeValue } from '@aws-sdk/client-dynamodb';
import type { StoredResponse } from '@oncely/core';
import { StoreOperationError } from '@oncely/core';
import type { IdempotencyRecord } from '@oncely/core/adapter';

/**
 * The item layout. One item per record, under the partition key (`prefix` + key):
 *   state          'in_progress' | 'completed' | 'released'  fingerprint  as given to acquire (kept on resume)
 *   token          fencing token of the current owner      completion    id of the complete call that wrote it
 *   lockExpiresAt  lease end, epoch ms (in progress only)  expiresAt     lease end or TTL end, epoch ms
 *   <ttlAttribute> expiresAt in epoch seconds, rounded up: what DynamoDB's TTL deletion reads
 *   status         HTTP status    headers  JSON (S)        body          raw bytes (B); absent when empty
 *   bodyChunks, bodyChunkId, bodyBytes: set instead of `body` when the body was too large for one item and was
 *   split over chunk items (see `chunkKey`).
 *   steps          map of step name to encoded result (M); an empty map from acquire on, so that recordStep can set
 *                  one entry in one request (a path into a missing map is refused)
 *   stepsUntil     latest recordStep + its ttl, epoch ms: present iff the record carries steps
 *   stepsTtl       that ttl in seconds, rounded up: lets renew and release keep <ttlAttribute> past stepsUntil
 *   stepsFingerprint  the fingerprint the steps were recorded under: a resuming acquire keeps it
 * Times are the application's clock (`Date.now()`): DynamoDB has no server-side clock function.
 */
export const ATTR = {
  /** The record's state as stored. */
  state: 'state',
  /** The request fingerprint given to acquire. */
  fingerprint: 'fingerprint',
  /** The current owner's fencing token. */
  token: 'token',
  /** The id of the complete call that wrote the response. */
  completion: 'completion',
  /** Lease end, epoch ms (in progress only). */
  lockExpiresAt: 'lockExpiresAt',
  /** Lease end or TTL end, epoch ms. */
  expiresAt: 'expiresAt',
  /** The stored response's HTTP status. */
  status: 'status',
  /** The stored response's headers, as JSON. */
  headers: 'headers',
  /** The stored response's body bytes; absent when empty or in chunk items. */
  body: 'body',
  /** How many chunk items hold the body, when it is in chunk items. */
  chunks: 'bodyChunks',
  /** The chunk items' id (a random UUID per completion). */
  chunkId: 'bodyChunkId',
  /** The body's whole size, when it is in chunk items. */
  bodyBytes: 'bodyBytes',
  /** Map of step name to encoded result. */
  steps: 'steps',
  /** Latest recordStep plus its ttl, epoch ms: present iff the record carries steps. */
  stepsUntil: 'stepsUntil',
  /** That ttl in seconds, rounded up. */
  stepsTtl: 'stepsTtl',
  /** The fingerprint the steps were recorded under. */
  stepsFingerprint: 'stepsFingerprint',
} as const;

export const RESERVED_ATTRIBUTES: ReadonlySet<string> = new Set(Object.values(ATTR));

/** A DynamoDB item, as the low-level client reads and writes it. */
export type Item = Record<string, AttributeValue>;

/** DynamoDB's item size limit: attribute names and values, UTF-8, 400 KB. */
export const MAX_ITEM_BYTES = 400 * 1024;
/** DynamoDB's partition key limit. */
export const MAX_KEY_BYTES = 2048;
/** Body bytes per chunk item: leaves room for the chunk's key and attributes under MAX_ITEM_BYTES. */
export const CHUNK_BYTES = 384 * 1024;
/** One BatchWriteItem (25 puts) writes all chunks of a body; above this the body is not kept (replay 410). */
export const MAX_CHUNKS = 25;
/**
 * The fingerprint is not known when `complete` sizes the item (acquire stored it). oncely's own fingerprints are
 * 43 bytes; this covers custom ones up to 1 KiB, and a larger one makes DynamoDB refuse the write, which `complete`
 * answers by moving the body out of the item.
 */
export const FINGERPRINT_ALLOWANCE = 1024;

const utf8 = (value: string) => Buffer.byteLength(value, 'utf8');
// A DynamoDB number takes at most 21 bytes.
const NUMBER_BYTES = 21;

/** Upper bound of the completed record item's size, with the body inline (or `bodyBytes` 0 when it is not). */
export function completedItemBytes(
  names: { partitionKey: string; ttlAttribute: string },
  pk: string,
  token: string,
  completion: string,
  headersJson: string,
  bodyBytes: number,
): number {
  const strings: [string, number][] = [
    [names.partitionKey, utf8(pk)],
    [ATTR.state, utf8('completed')],
    [ATTR.fingerprint, FINGERPRINT_ALLOWANCE],
    [ATTR.token, utf8(token)],
    [ATTR.completion, utf8(completion)],
    [ATTR.headers, utf8(headersJson)],
    [ATTR.body, bodyBytes],
    // Chunk references, when the body is not inline (never both; counted anyway, it is small).
    [ATTR.chunkId, 36],
  ];
  const numbers = [ATTR.expiresAt, names.ttlAttribute, ATTR.status, ATTR.chunks, ATTR.bodyBytes];
  let size = 0;
  for (const [name, bytes] of strings) size += utf8(name) + bytes;
  for (const name of numbers) size += utf8(name) + NUMBER_BYTES;
  return size;
}

export const n = (value: number): AttributeValue => ({ N: String(value) });
export const s = (value: string): AttributeValue => ({ S: value });
/** DynamoDB's TTL attribute is in epoch seconds; rounding up never deletes a record before its end. */
export const seconds = (ms: number): AttributeValue => n(Math.ceil(ms / 1000));

function str(item: Item, name: string): string | undefined {
  const value = item[name];
  return value !== undefined && 'S' in value ? value.S : undefined;
}

function num(item: Item, name: string): number | undefined {
  const value = item[name];
  return value !== undefined && 'N' in value && value.N !== undefined ? Number(value.N) : undefined;
}

function bytes(item: Item, name: string): Uint8Array | undefined {
  const value = item[name];
  return value !== undefined && 'B' in value ? value.B : undefined;
}

/** A record as read from its item; the body may still be in chunk items (`chunks`). */
export interface ParsedRecord extends Omit<IdempotencyRecord, 'response' | 'state'> {
  /** As stored: a lapsed in-progress record that carries steps is only released when judged (`stateAt`). */
  state: 'in_progress' | 'completed' | 'released';
  /** The id of the complete call that wrote the response (completed records only). */
  completion: string | undefined;
  /** `stepsUntil`: set iff the record carries steps. */
  stepsUntil?: number;
  /** Completed: the stored response, its body undefined while it is still in chunk items. */
  response?: Omit<StoredResponse, 'body'> & {
    /** The body's bytes, or undefined when it is in chunk items (`chunks`). */
    body: Uint8Array | undefined;
  };
  /** Set when the body is in chunk items: where they are and what they hold. */
  chunks?: {
    /** The chunk items' id (`chunkKeyOf`). */
    id: string;
    /** How many chunk items there are. */
    count: number;
    /** The body's whole size, in bytes. */
    bytes: number;
  };
}

/**
 * Decodes a record's item; throws `StoreOperationError` for an item that is not an oncely record (`where` names it
 * in the message).
 */
export function parseItem(item: Item, where: string): ParsedRecord {
  const state = str(item, ATTR.state);
  const fingerprint = str(item, ATTR.fingerprint);
  const token = str(item, ATTR.token);
  const expiresAt = num(item, ATTR.expiresAt);
  if (
    (state !== 'in_progress' && state !== 'completed' && state !== 'released') ||
    fingerprint === undefined ||
    token === undefined ||
    expiresAt === undefined
  ) {
    throw new StoreOperationError(`oncely/dynamodb: the item under ${where} is not an oncely record`);
  }
  const record: ParsedRecord = {
    state,
    fingerprint,
    token,
    completion: str(item, ATTR.completion),
    lockExpiresAt: num(item, ATTR.lockExpiresAt) ?? 0,
    expiresAt,
  };
  const stepsUntil = num(item, ATTR.stepsUntil);
  if (stepsUntil !== undefined && state !== 'completed') {
    record.stepsUntil = stepsUntil;
    // fromEntries: a step named `__proto__` stays an own property.
    record.steps = Object.fromEntries(
      Object.entries(item[ATTR.steps]?.M ?? {}).flatMap(([name, value]) =>
        value.S === undefined ? [] : [[name, value.S]],
      ),
    );
  }
  if (state === 'completed') {
    record.response = {
      status: num(item, ATTR.status) ?? 0,
      headers: JSON.parse(str(item, ATTR.headers) ?? '{}') as StoredResponse['headers'],
      body: bytes(item, ATTR.body),
    };
    const count = num(item, ATTR.chunks);
    const id = str(item, ATTR.chunkId);
    if (count !== undefined && count > 0 && id !== undefined) {
      record.chunks = { id, count, bytes: num(item, ATTR.bodyBytes) ?? 0 };
    }
  }
  return record;
}

/** When the record is over: its lease or TTL end, or later while its steps are kept. */
export function endOf(record: ParsedRecord): number {
  return Math.max(record.expiresAt, record.stepsUntil ?? 0);
}

/**
 * The record a live item holds in `state` (`stateAt`), as `get` answers it, without the response: a completed
 * record's body may be in chunk items, which the caller reads (or not).
 */
export function recordOf(parsed: ParsedRecord, state: ParsedRecord['state']): IdempotencyRecord {
  const record: IdempotencyRecord = {
    state,
    fingerprint: parsed.fingerprint,
    token: parsed.token,
    lockExpiresAt: parsed.lockExpiresAt,
    expiresAt: endOf(parsed),
  };
  if (state !== 'completed' && parsed.steps !== undefined) record.steps = parsed.steps;
  return record;
}

/**
 * The state of a live record at `now`: an in-progress record that carries steps and whose lease ran out is
 * `released` (free for acquire, which resumes it); `undefined` when the record is over (absent). A released record
 * without steps is over whatever `now` is: its times are the releasing server's clock, which may be ahead of ours.
 */
export function stateAt(record: ParsedRecord, now: number): ParsedRecord['state'] | undefined {
  if (record.state === 'released' && record.stepsUntil === undefined) return undefined;
  if (endOf(record) <= now) return undefined;
  if (record.state === 'in_progress' && record.lockExpiresAt <= now) {
    return record.stepsUntil !== undefined ? 'released' : undefined;
  }
  return record.state;
}

/** Splits a body into chunk-sized views (no copies). */
export function split(body: Uint8Array, size = CHUNK_BYTES): Uint8Array[] {
  const chunks: Uint8Array[] = [];
  for (let offset = 0; offset < body.byteLength; offset += size) {
    chunks.push(body.subarray(offset, Math.min(offset + size, body.byteLength)));
  }
  return chunks;
}
