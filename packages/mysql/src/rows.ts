import type { StoredResponse } from '@oncely/core';
import type { IdempotencyRecord, RecordedSteps } from '@oncely/core/adapter';

const STATE: Record<string, IdempotencyRecord['state']> = {
  in_progress: 'in_progress',
  completed: 'completed',
};

/** A JSON text column as stored (a string), or already decoded by a driver that decodes JSON. */
function json<T>(value: unknown, empty: T): T {
  if (value === null || value === undefined) return empty;
  if (typeof value === 'string') return JSON.parse(value) as T;
  if (Buffer.isBuffer(value)) return JSON.parse(value.toString('utf8')) as T;
  return value as T;
}

export function toResponse(row: Record<string, unknown>): StoredResponse {
  const body = row.body;
  return {
    status: Number(row.status),
    headers: json<StoredResponse['headers']>(row.headers, {}),
    body: Buffer.isBuffer(body) ? body : body instanceof Uint8Array ? Buffer.from(body) : Buffer.alloc(0),
  };
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** The parameters of the complete statements (status, headers as JSON, body, ttlMs, key, token). */
export function completeParams(
  key: string,
  token: string,
  response: StoredResponse,
  ttlMs: number,
): unknown[] {
  return [response.status, JSON.stringify(response.headers), toBuffer(response.body), ttlMs, key, token];
}

export function steps(value: unknown): RecordedSteps | null {
  return value === null || value === undefined ? null : json<RecordedSteps>(value, {});
}

/** A record as the store's `get` reads it (the columns of `recordsLayout().columns()`, `get`'s among them). */
export function toRecord(row: Record<string, unknown>): IdempotencyRecord {
  const record: IdempotencyRecord = {
    state: Number(row.released) === 1 ? 'released' : (STATE[String(row.state)] ?? 'in_progress'),
    fingerprint: String(row.fingerprint),
    token: String(row.token),
    lockExpiresAt: Number(row.lock_ms),
    expiresAt: Number(row.expires_ms),
  };
  if (record.state === 'completed') record.response = toResponse(row);
  const recorded = steps(row.steps);
  if (recorded !== null) record.steps = recorded;
  return record;
}

/** A row read with `recordsLayout().columns()`, decoded. */
export interface DecodedRow {
  /** The store key (the key column's bytes, as UTF-8). */
  key: string;
  /** The record, as the store decodes it. */
  record: IdempotencyRecord;
  /** Epoch milliseconds, from the database's clock. */
  createdAt: number;
  /** The whole body's length (the record's `body` may be cut: `columns({ bodyBytes })`). */
  bodyBytes: number;
  /** The database's clock when it read the row, in epoch milliseconds: what the record's times compare with. */
  now: number;
}

/** Decodes a row read with `recordsLayout().columns()`. */
export function decodeRecord(row: Record<string, unknown>): DecodedRow {
  const key = row.key;
  return {
    key: Buffer.isBuffer(key) ? key.toString('utf8') : String(key),
    record: toRecord(row),
    createdAt: Number(row.created_ms),
    bodyBytes: row.body_length === null || row.body_length === undefined ? 0 : Number(row.body_length),
    now: Number(row.now_ms),
  };
}
