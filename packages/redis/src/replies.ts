import type { AcquireResult, IdempotencyRecord, StoredResponse } from '@oncely/core';

/** The one place script replies are turned into store results (ioredis Buffer replies: bulk strings are Buffers). */

type Reply = Buffer | number | null | Reply[];

const text = (value: Reply | undefined): string =>
  Buffer.isBuffer(value) ? value.toString('utf8') : String(value ?? '');

function response(
  status: Reply | undefined,
  headers: Reply | undefined,
  body: Reply | undefined,
): StoredResponse {
  return {
    status: Number(text(status)),
    headers: JSON.parse(text(headers)) as StoredResponse['headers'],
    body: Buffer.isBuffer(body) ? body : Buffer.alloc(0),
  };
}

export function parseAcquire(reply: unknown, token: string): AcquireResult {
  const r = reply as Reply[];
  const tag = text(r[0]);
  if (tag === 'a') return { status: 'acquired', token };
  if (tag === 'p') return { status: 'in_progress', fingerprint: text(r[1]), retryAfterMs: Number(r[2]) };
  if (tag === 'c')
    return { status: 'completed', fingerprint: text(r[1]), response: response(r[2], r[3], r[4]) };
  throw new Error(`oncely/redis: unexpected acquire reply ${JSON.stringify(tag)}`);
}

export function parseFlag(reply: unknown): boolean {
  return reply === 1;
}

export function parseGet(reply: unknown): IdempotencyRecord | undefined {
  if (reply === null || reply === undefined) return undefined;
  const r = reply as Reply[];
  const completed = text(r[0]) === 'c';
  const record: IdempotencyRecord = {
    state: completed ? 'completed' : 'in_progress',
    fingerprint: text(r[1]),
    token: text(r[2]),
    lockExpiresAt: Number(text(r[3])),
    expiresAt: Number(r[7]),
  };
  if (completed) record.response = response(r[4], r[5], r[6]);
  return record;
}
