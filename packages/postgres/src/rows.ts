import type { StoredResponse } from '@oncely/core';
import type { IdempotencyRecord, RecordedSteps, SqlResult } from '@oncely/core/adapter';

/** Runs one statement of the store (`$n` placeholders) wherever it goes: the pool, postgres.js, an ORM's transaction. */
export type Query = (statement: string, params: readonly unknown[]) => Promise<SqlResult>;

/*
 * Each library decodes a row its own way: `pg` gives bigint as a string, postgres.js and Prisma as a bigint (or a
 * number); bytea comes as a Buffer, a Uint8Array or the `\x...` hex text; jsonb as an object or its text. Every row
 * the store reads goes through these, so that the store sees one shape whatever library ran the statement.
 */

export function toNumber(value: unknown): number {
  return typeof value === 'number' ? value : Number(value);
}

export function toText(value: unknown): string | null {
  if (value === null || value === undefined) return null;
  return typeof value === 'string' ? value : String(value);
}

export function toBool(value: unknown): boolean {
  return value === true || value === 't' || value === 'true' || value === 1;
}

export function toBytes(value: unknown): Buffer | null {
  if (value === null || value === undefined) return null;
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  if (typeof value === 'string') {
    return value.startsWith('\\x') ? Buffer.from(value.slice(2), 'hex') : Buffer.from(value, 'utf8');
  }
  // A Buffer that went through JSON ({ type: 'Buffer', data: [...] }), or a plain array of bytes.
  if (Array.isArray(value)) return Buffer.from(value as number[]);
  const data = (value as { data?: unknown }).data;
  if (Array.isArray(data)) return Buffer.from(data as number[]);
  throw new TypeError(`oncely/postgres: cannot read a bytea column decoded as ${typeof value}`);
}

export function toJson<T>(value: unknown): T | null {
  if (value === null || value === undefined) return null;
  return (typeof value === 'string' ? JSON.parse(value) : value) as T;
}

/** A completed record's response, from the `status`, `headers` and `body` columns. */
export function toResponse(row: Record<string, unknown>): StoredResponse {
  return {
    status: toNumber(row.status),
    headers: toJson<StoredResponse['headers']>(row.headers) ?? {},
    body: toBytes(row.body) ?? Buffer.alloc(0),
  };
}

export function toSteps(value: unknown): RecordedSteps | null {
  return toJson<RecordedSteps>(value);
}

/** A body as a Buffer, without copying: every library takes a Buffer for a bytea parameter. */
export function bodyParam(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** The parameters of the complete statements ($1 key ... $6 ttlMs); headers as JSON text, which jsonb takes from any library. */
export function completeParams(
  key: string,
  token: string,
  response: StoredResponse,
  ttlMs: number,
): unknown[] {
  return [key, token, response.status, JSON.stringify(response.headers), bodyParam(response.body), ttlMs];
}

const STATE: Record<string, IdempotencyRecord['state']> = {
  in_progress: 'in_progress',
  completed: 'completed',
};

/** A record as the store's `get` reads it (the columns of `recordsLayout().columns()`, `get`'s among them). */
export function toRecord(row: Record<string, unknown>): IdempotencyRecord {
  const record: IdempotencyRecord = {
    state: toBool(row.released) ? 'released' : (STATE[toText(row.state) ?? ''] ?? 'in_progress'),
    fingerprint: toText(row.fingerprint) ?? '',
    token: toText(row.token) ?? '',
    lockExpiresAt: toNumber(row.lockms),
    expiresAt: toNumber(row.expiresms),
  };
  if (record.state === 'completed') record.response = toResponse(row);
  const steps = toSteps(row.steps);
  if (steps !== null) record.steps = steps;
  return record;
}

/** A row read with `recordsLayout().columns()`, decoded. */
export interface DecodedRow {
  /** The store key. */
  key: string;
  /** The record, as the store decodes it. */
  record: IdempotencyRecord;
  /** Epoch milliseconds, from the database's clock. */
  createdAt: number;
  /** The whole body's length (the record's `body` may be cut: `columns({ bodyBytes })`). */
  bodyBytes: number;
  /** The row's size in the table (`pg_column_size`), its TOASTed values compressed as stored. */
  rowBytes: number;
  /** The database's clock when it read the row, in epoch milliseconds: what the record's times compare with. */
  now: number;
}

/** Decodes a row read with `recordsLayout().columns()`. */
export function decodeRecord(row: Record<string, unknown>): DecodedRow {
  return {
    key: toText(row.key) ?? '',
    record: toRecord(row),
    createdAt: toNumber(row.createdms),
    bodyBytes: row.bodylength === null || row.bodylength === undefined ? 0 : toNumber(row.bodylength),
    rowBytes: toNumber(row.rowbytes),
    now: toNumber(row.nowms),
  };
}
