import { IdempotentFetchOptionsError } from './errors';

// What an oncely server accepts (and the IETF draft's examples use): visible ASCII, at most 255 characters.
const VISIBLE_ASCII = /^[\x21-\x7e]{1,255}$/;

/** A random UUID v4. `crypto.randomUUID` exists only in secure contexts (https, localhost) in browsers. */
export function newKey(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = ((bytes[6] ?? 0) & 0x0f) | 0x40; // version 4
  bytes[8] = ((bytes[8] ?? 0) & 0x3f) | 0x80; // variant 10
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A per-call `key` that no oncely server would refuse with a 400; a TypeError names the problem. */
export function checkKey(key: unknown): string {
  if (typeof key !== 'string' || !VISIBLE_ASCII.test(key))
    throw new IdempotentFetchOptionsError(
      'key',
      `oncely: key must be 1 to 255 visible ASCII characters (no spaces), such as crypto.randomUUID(); got ${JSON.stringify(key)}`,
    );
  return key;
}
