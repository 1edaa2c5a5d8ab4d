import type { AcquireResult, StoredResponse } from '@oncely/core';
import { StoreOperationError } from '@oncely/core';
import type { IdempotencyRecord } from '@oncely/core/adapter';

/**
 * The one place script replies are turned into store results, and records into script arguments (the layout is
 * in `scripts.ts`). Bulk strings arrive as Buffers, integers as numbers, whichever the client.
 */

type Reply = Buffer | number | null | Reply[];

const COLON = 0x3a;
/** 'p' (1 byte) and the token (36): an in-progress record's fingerprint starts here. */
const IN_PROGRESS_FINGERPRINT = 37;

const text = (value: Reply | undefined): string =>
  Buffer.isBuffer(value) ? value.toString('utf8') : String(value ?? '');

/** A decimal number in `record` from `start` up to the next ':'; `end` is that colon's position. */
function numberAt(record: Buffer, start: number): { value: number; end: number } {
  const end = record.indexOf(COLON, start);
  if (end < 0) throw new StoreOperationError('oncely/redis: a stored record is cut short');
  return { value: Number(record.toString('latin1', start, end)), end };
}

/** A completed record: 'c' | fingerprint length ':' fingerprint | status ':' headers length ':' headers | body. */
function completed(record: Buffer): { fingerprint: string; response: StoredResponse } {
  const fingerprintLength = numberAt(record, 1);
  const fingerprintEnd = fingerprintLength.end + 1 + fingerprintLength.value;
  const status = numberAt(record, fingerprintEnd);
  const headersLength = numberAt(record, status.end + 1);
  const bodyStart = headersLength.end + 1 + headersLength.value;
  return {
    fingerprint: record.toString('utf8', fingerprintLength.end + 1, fingerprintEnd),
    response: {
      status: status.value,
      headers: JSON.parse(
        record.toString('utf8', headersLength.end + 1, bodyStart),
      ) as StoredResponse['headers'],
      body: record.subarray(bodyStart),
    },
  };
}

/** What `complete` sends before the body: status ':' headers length ':' headers (the script adds the rest). */
export function responseHead(response: StoredResponse): string {
  const headers = JSON.stringify(response.headers);
  return `${response.status}:${Buffer.byteLength(headers)}:${headers}`;
}

/** A whole completed record (`putCompleted` writes it as given). */
export function completedRecord(fingerprint: string, response: StoredResponse, body: Buffer): Buffer {
  return Buffer.concat([
    Buffer.from(`c${Buffer.byteLength(fingerprint)}:${fingerprint}${responseHead(response)}`),
    body,
  ]);
}

export function parseAcquire(reply: unknown, token: string): AcquireResult {
  if (reply === 1) return { status: 'acquired', token };
  if (Buffer.isBuffer(reply)) return { status: 'completed', ...completed(reply) };
  if (Array.isArray(reply) && Buffer.isBuffer(reply[0])) {
    return {
      status: 'in_progress',
      fingerprint: reply[0].toString('utf8', IN_PROGRESS_FINGERPRINT),
      retryAfterMs: Math.max(0, Number(reply[1])),
    };
  }
  throw new StoreOperationError(`oncely/redis: unexpected acquire reply ${JSON.stringify(reply)}`);
}

/**
 * The reply of acquire's `SET ... NX GET`, in the acquire script's terms: 1 when it reserved the key (nothing was
 * there), the record when it is completed, undefined for an in-progress record (the script must be asked for its
 * remaining lease).
 */
export function parseReserve(reply: unknown): 1 | Buffer | undefined {
  if (reply === null || reply === undefined) return 1;
  if (Buffer.isBuffer(reply) && reply[0] === 0x63) return reply;
  return undefined;
}

export function parseFlag(reply: unknown): boolean {
  return reply === 1;
}

export function parseGet(reply: unknown): IdempotencyRecord | undefined {
  if (reply === null || reply === undefined) return undefined;
  const r = reply as Reply[];
  if (r.length === 2) {
    const record = r[0] as Buffer;
    const expiresAt = Number(r[1]);
    if (record[0] === 0x63) {
      // Completed: the lease is over, and the token is not kept (nothing can fence with it any more).
      return { state: 'completed', token: '', lockExpiresAt: 0, expiresAt, ...completed(record) };
    }
    return {
      state: 'in_progress',
      // The store's token: the UUID and the fingerprint (scripts.ts).
      token: record.toString('utf8', 1),
      fingerprint: record.toString('utf8', IN_PROGRESS_FINGERPRINT),
      // The key's expiry is the lease.
      lockExpiresAt: expiresAt,
      expiresAt,
    };
  }
  // A record of the hash layout (scripts.ts): { state, fingerprint, token, lease end, status, headers, body, expiry }.
  const isCompleted = text(r[0]) === 'c';
  const record: IdempotencyRecord = {
    state: isCompleted ? 'completed' : 'in_progress',
    fingerprint: text(r[1]),
    token: text(r[2]),
    lockExpiresAt: Number(text(r[3])),
    expiresAt: Number(r[7]),
  };
  if (isCompleted) {
    record.response = {
      status: Number(text(r[4])),
      headers: JSON.parse(text(r[5])) as StoredResponse['headers'],
      body: Buffer.isBuffer(r[6]) ? r[6] : Buffer.alloc(0),
    };
  }
  return record;
}
