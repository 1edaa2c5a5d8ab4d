import { STATUS_CODES } from 'node:http';
import type { StoredResponse } from '@oncely/core';
import type { CapturedResponse } from '@oncely/core/adapter';
import type { EventRequest } from './events';

/**
 * A stored header saying the handler returned its body base64-encoded (binary): the body is stored as its bytes,
 * and a replay encodes them again with `isBase64Encoded: true`. Never sent.
 */
export const BASE64_MARK = 'x-oncely-lambda-base64';

type HeaderValue = string | number | boolean;

/** A handler's result as a response to store, or why it is none (API Gateway and ALB answer those with a 502). */
export function captureResult(
  result: unknown,
  request: EventRequest,
  maxBodyBytes: number,
): CapturedResponse | string {
  if (typeof result !== 'object' || result === null || typeof (result as Loose).statusCode !== 'number') {
    // Payload 2.0 (HTTP API, Function URLs) turns anything else into a 200 of JSON; 1.0 and ALB refuse it.
    if (request.kind !== 'v2') return describe(result);
    if (result === undefined) return describe(result);
    const body = typeof result === 'string' ? result : JSON.stringify(result);
    if (typeof body !== 'string') return describe(result);
    const bytes = Buffer.from(body, 'utf8');
    return {
      status: 200,
      headers: { 'content-type': 'application/json' },
      body: bytes.byteLength <= maxBodyBytes ? bytes : undefined,
    };
  }
  const r = result as Loose;
  const headers: Record<string, string | string[]> = {};
  const single = r.headers as Record<string, HeaderValue | undefined> | undefined;
  if (typeof single === 'object' && single !== null) {
    for (const name in single) {
      const value = single[name];
      if (value !== undefined) headers[name.toLowerCase()] = String(value);
    }
  }
  const multi = r.multiValueHeaders as Record<string, HeaderValue[] | undefined> | undefined;
  if (typeof multi === 'object' && multi !== null) {
    // Where both name a header, the platforms send multiValueHeaders' values.
    for (const name in multi) {
      const values = multi[name];
      if (Array.isArray(values) && values.length > 0)
        headers[name.toLowerCase()] = values.length === 1 ? String(values[0]) : values.map(String);
    }
  }
  // `cookies` (payload 2.0) and Set-Cookie are the first response's only: never stored (the engine drops
  // set-cookie too).
  delete headers['set-cookie'];
  const raw = r.body;
  if (raw !== undefined && raw !== null && typeof raw !== 'string') return 'a body that is not a string';
  const base64 = r.isBase64Encoded === true;
  const bytes = raw === undefined || raw === null ? EMPTY : Buffer.from(raw, base64 ? 'base64' : 'utf8');
  if (base64) headers[BASE64_MARK] = '1';
  else delete headers[BASE64_MARK];
  return {
    status: r.statusCode as number,
    headers,
    body: bytes.byteLength <= maxBodyBytes ? bytes : undefined,
  };
}

/**
 * A stored response (a replay) or one of the engine's answers (a problem) in the result format the event expects:
 * ALB adds `statusDescription`, and answers in `multiValueHeaders` when the request came with them.
 */
export function toResult<T = Loose>(stored: StoredResponse, request: EventRequest): T {
  const base64 = stored.headers[BASE64_MARK] !== undefined;
  const body = Buffer.from(stored.body.buffer, stored.body.byteOffset, stored.body.byteLength).toString(
    base64 ? 'base64' : 'utf8',
  );
  const result: Loose = { statusCode: stored.status };
  if (request.kind === 'alb') {
    const phrase = STATUS_CODES[stored.status];
    result.statusDescription = phrase === undefined ? String(stored.status) : `${stored.status} ${phrase}`;
  }
  if (request.kind === 'alb' && request.multiValue) {
    const multi: Record<string, string[]> = {};
    for (const name in stored.headers) {
      const value = stored.headers[name];
      if (!sent(name) || value === undefined) continue;
      multi[name] = typeof value === 'string' ? [value] : [...value];
    }
    result.multiValueHeaders = multi;
  } else {
    const headers: Record<string, string> = {};
    let multi: Record<string, string[]> | undefined;
    for (const name in stored.headers) {
      const value = stored.headers[name];
      if (!sent(name) || value === undefined) continue;
      if (typeof value === 'string') headers[name] = value;
      else if (request.kind === 'v1') {
        multi ??= {};
        multi[name] = [...value];
      }
      // Payload 2.0 and an ALB without multi-value headers have one value per name: joined, as HTTP allows.
      else headers[name] = value.join(', ');
    }
    result.headers = headers;
    if (multi !== undefined) result.multiValueHeaders = multi;
  }
  result.body = body;
  result.isBase64Encoded = base64;
  return result as T;
}

// Lambda's platforms set the length themselves.
const sent = (name: string): boolean => name !== BASE64_MARK && name !== 'content-length';

function describe(result: unknown): string {
  return result === null
    ? 'null'
    : typeof result === 'object'
      ? 'an object without a numeric statusCode'
      : typeof result;
}

type Loose = Record<string, unknown>;
const EMPTY = new Uint8Array(0);
