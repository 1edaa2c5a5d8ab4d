import type { StoredResponse } from '../stores/store';
import { IdempotencyReplayError, PermanentError, UnstorableResultError } from './errors';

// How idempotent() turns a result (or a permanent failure) into a record and a record back into what a duplicate
// gets: JSON by default, refusing what JSON would not give back, or the caller's serialiser.

/** Turns results into bytes for the store and back. The default is JSON (see `idempotent`). */
export interface ResultSerializer<R> {
  /** Stored as the record's `content-type`. Default: `'application/octet-stream'`. */
  contentType?: string;
  /** Turns the function's result into the bytes stored. May throw: the result is then unstorable. */
  serialize(result: R): Uint8Array;
  /** Turns stored bytes back into a result, for a duplicate. May throw: the duplicate gets `IdempotencyReplayError`. */
  deserialize(bytes: Uint8Array): R;
}

// How a record written by idempotent() says what it holds: a result, a permanent failure, or "ran, not storable".
// HTTP-like statuses, so every store keeps them unchanged and an operator reading a record can tell them apart.
export const STATUS_RESULT = 200;
const STATUS_NOT_STORED = 410;
const STATUS_FAILURE = 500;
const JSON_TYPE = 'application/json';

/**
 * What a record written by `idempotent()` gives a duplicate: the stored result, or the stored permanent failure or
 * "ran, not storable" marker thrown again. A record of another kind (an HTTP response) is refused.
 */
export function replayResult<R>(
  serializer: ResultSerializer<R> | undefined,
  key: string,
  response: StoredResponse,
): R {
  switch (response.status) {
    case STATUS_RESULT:
      try {
        return serializer === undefined
          ? (JSON.parse(textOf(response.body)) as R)
          : serializer.deserialize(response.body);
      } catch (error) {
        throw new IdempotencyReplayError(key, 'the stored result could not be deserialised.', {
          cause: error,
        });
      }
    case STATUS_FAILURE: {
      const failure = parseRecord(key, response.body);
      throw new PermanentError(typeof failure.message === 'string' ? failure.message : 'permanent failure', {
        code: typeof failure.code === 'string' || typeof failure.code === 'number' ? failure.code : undefined,
        originalName: typeof failure.name === 'string' ? failure.name : 'Error',
        replayed: true,
      });
    }
    case STATUS_NOT_STORED: {
      const marker = parseRecord(key, response.body);
      throw new UnstorableResultError(
        key,
        typeof marker.reason === 'string' ? marker.reason : 'unknown reason',
        true,
      );
    }
    default:
      throw new IdempotencyReplayError(
        key,
        `the record was not written by idempotent() (status ${response.status}); use distinct keys (or stores) for HTTP requests and function calls.`,
      );
  }
}

function parseRecord(key: string, body: Uint8Array): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(textOf(body));
    if (value !== null && typeof value === 'object') return value as Record<string, unknown>;
  } catch {
    // reported below
  }
  throw new IdempotencyReplayError(key, 'the stored record is malformed.');
}

/** The record of a permanent failure: what a duplicate's `PermanentError` is rebuilt from. */
export function failureRecord(error: unknown): StoredResponse {
  const e = (error !== null && typeof error === 'object' ? error : {}) as {
    name?: unknown;
    message?: unknown;
    code?: unknown;
  };
  const failure: Record<string, unknown> = {
    name:
      error instanceof PermanentError ? error.originalName : typeof e.name === 'string' ? e.name : 'Error',
    message: typeof e.message === 'string' ? e.message : String(error),
  };
  if (typeof e.code === 'string' || typeof e.code === 'number') failure.code = e.code;
  return jsonRecord(STATUS_FAILURE, failure);
}

/** The record of a call that ran but whose result could not be stored: the key stays executed. */
export function notStoredRecord(reason: string): StoredResponse {
  return jsonRecord(STATUS_NOT_STORED, { reason });
}

function jsonRecord(status: number, value: unknown): StoredResponse {
  return {
    status,
    headers: { 'content-type': JSON_TYPE },
    body: new TextEncoder().encode(JSON.stringify(value)),
  };
}

/** The record of a result encoded by `encodeResult`, typed as its serialiser says. */
export function resultRecord<R>(
  serializer: ResultSerializer<R> | undefined,
  bytes: Uint8Array,
): StoredResponse {
  return {
    status: STATUS_RESULT,
    headers: {
      'content-type':
        serializer === undefined ? JSON_TYPE : (serializer.contentType ?? 'application/octet-stream'),
    },
    body: bytes,
  };
}

const decoder = new TextDecoder();
/** The text of stored bytes (UTF-8). */
export function textOf(body: Uint8Array): string {
  return decoder.decode(body);
}

/** Bytes to store, or why the value cannot be stored (with the serialiser's error when there was one). */
export function encodeResult<R>(
  serializer: ResultSerializer<R> | undefined,
  maxResultBytes: number,
  value: R,
): { bytes: Uint8Array } | { reason: string; cause?: unknown } {
  let bytes: Uint8Array;
  if (serializer !== undefined) {
    let out: unknown;
    try {
      out = serializer.serialize(value);
    } catch (error) {
      return { reason: `serialize() threw: ${messageOf(error)}`, cause: error };
    }
    if (!(out instanceof Uint8Array))
      return { reason: `serialize() returned ${typeof out}, not a Uint8Array` };
    bytes = out;
  } else {
    if (value === undefined) return { reason: 'the result is undefined (return null for "no result")' };
    const text = jsonText(value);
    if (!('json' in text)) return text;
    bytes = new TextEncoder().encode(text.json);
  }
  if (bytes.byteLength > maxResultBytes) {
    return {
      reason: `the result is ${bytes.byteLength} bytes, more than maxResultBytes (${maxResultBytes})`,
    };
  }
  return { bytes };
}

/**
 * The JSON text of a value (not `undefined`), or why JSON would not give it back: a function, symbol, BigInt, Map
 * or Set anywhere, a cycle, no JSON form at all. The checks of the default serialiser, shared with `step()`.
 */
export function jsonText(value: unknown): { json: string } | { reason: string; cause?: unknown } {
  let json: string | undefined;
  try {
    json = JSON.stringify(value, strictJson);
  } catch (error) {
    if (error instanceof NotJson) return { reason: error.message };
    const message = messageOf(error);
    return /circular/i.test(message)
      ? { reason: 'the result contains a circular reference', cause: error }
      : { reason: `JSON.stringify failed: ${message}`, cause: error };
  }
  return json === undefined ? { reason: 'the result has no JSON form' } : { json };
}

class NotJson extends Error {}

// JSON.stringify drops functions and symbols silently, writes Maps and Sets as {}, and throws on BigInt without
// saying where: refuse them all, naming the property, so a replay is never quietly different from the original.
function strictJson(this: unknown, key: string, value: unknown): unknown {
  const where = key === '' ? '' : ` at property ${JSON.stringify(key)}`;
  switch (typeof value) {
    case 'function':
      throw new NotJson(`the result contains a function${where}`);
    case 'symbol':
      throw new NotJson(`the result contains a symbol${where}`);
    case 'bigint':
      throw new NotJson(`the result contains a BigInt${where} (convert it to a string)`);
  }
  if (value instanceof Map || value instanceof Set) {
    throw new NotJson(`the result contains a ${value instanceof Map ? 'Map' : 'Set'}${where}`);
  }
  return value;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
