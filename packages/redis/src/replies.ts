import type { AcquireResult, StoredResponse } from '@oncely/core';
import { StoreOperationError } from '@oncely/core';
import type { IdempotencyRecord, RecordedSteps } from '@oncely/core/adapter';

/**
 * The one place script replies are turned into store results, and records into script arguments (the layout is
 * in `scripts.ts`). Bulk strings arrive as Buffers, integers as numbers, whichever the client.
 */

type Reply = Buffer | number | null | Reply[];

const COLON = 0x3a;
/** 'p' (1 byte) and the token (36): an in-progress record's fingerprint starts here. */
const IN_PROGRESS_FINGERPRINT = 37;
/** A random UUID: the first part of every fencing token. */
export const TOKEN_ID_LENGTH = 36;
/** In a record with steps: where the UUID starts (after 's' and the lease end) and the fingerprint's length. */
const STEPS_UUID = 16;
const STEPS_FINGERPRINT = STEPS_UUID + TOKEN_ID_LENGTH + 15;
/** 's': a record with steps. */
const WITH_STEPS = 0x73;
/** 'p' and 'w': an in-progress record (a waiter listens to a 'w' one). */
const IN_PROGRESS = 0x70;
const WATCHED = 0x77;

/** A value under the prefix that is none of the layouts in `scripts.ts` (another app's key, a newer version's). */
const unknownLayout = () =>
  new StoreOperationError(
    'oncely/redis: the value under this key is not a record of a layout this version knows',
  );

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

/**
 * A record with steps: 's' | lease end (15 digits) | UUID (36) | steps' expiry (15 digits) | fingerprint length ':'
 * fingerprint | per step: name length ':' name | value length ':' value (scripts.ts).
 */
function withSteps(record: Buffer): {
  leaseEnd: number;
  token: string;
  fingerprint: string;
  steps: RecordedSteps;
} {
  const fingerprintLength = numberAt(record, STEPS_FINGERPRINT);
  const fingerprintEnd = fingerprintLength.end + 1 + fingerprintLength.value;
  const fingerprint = record.toString('utf8', fingerprintLength.end + 1, fingerprintEnd);
  const entries: [string, string][] = [];
  for (let at = fingerprintEnd; at < record.length; ) {
    const nameLength = numberAt(record, at);
    const nameEnd = nameLength.end + 1 + nameLength.value;
    const valueLength = numberAt(record, nameEnd);
    const valueEnd = valueLength.end + 1 + valueLength.value;
    if (valueEnd > record.length) throw new StoreOperationError('oncely/redis: a stored record is cut short');
    entries.push([
      record.toString('utf8', nameLength.end + 1, nameEnd),
      record.toString('utf8', valueLength.end + 1, valueEnd),
    ]);
    at = valueEnd;
  }
  return {
    leaseEnd: Number(record.toString('latin1', 1, STEPS_UUID)),
    // The store's token: the UUID and the fingerprint the record keeps, which `complete` writes.
    token: record.toString('latin1', STEPS_UUID, STEPS_UUID + TOKEN_ID_LENGTH) + fingerprint,
    fingerprint,
    // fromEntries defines own properties: a step named "__proto__" is a step like any other.
    steps: Object.fromEntries(entries),
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
  if (Buffer.isBuffer(reply)) {
    if (reply[0] !== WITH_STEPS) return { status: 'completed', ...completed(reply) };
    // Resumed: this call's UUID now holds the record, which keeps its fingerprint (in the token too) and steps.
    const { fingerprint, steps } = withSteps(reply);
    return { status: 'acquired', token: token.slice(0, TOKEN_ID_LENGTH) + fingerprint, steps, fingerprint };
  }
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
  if (r.length === 3) {
    const record = r[0] as Buffer;
    const expiresAt = Number(r[1]);
    if (record[0] === WITH_STEPS) {
      const { leaseEnd, token, fingerprint, steps } = withSteps(record);
      // A lease end of now or before: released, or its lease ran out (scripts.ts).
      const state = leaseEnd > Number(r[2]) ? 'in_progress' : 'released';
      return { state, token, fingerprint, lockExpiresAt: leaseEnd, expiresAt, steps };
    }
    if (record[0] === 0x63) {
      // Completed: the lease is over, and the token is not kept (nothing can fence with it any more).
      return { state: 'completed', token: '', lockExpiresAt: 0, expiresAt, ...completed(record) };
    }
    if (record[0] !== IN_PROGRESS && record[0] !== WATCHED) throw unknownLayout();
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
  if (!isCompleted && text(r[0]) !== 'p') throw unknownLayout();
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
