import * as crypto from 'node:crypto';
import { InvalidValueError, ValueOutOfRangeError } from '../shared/errors';

// One-shot hashing (Node >= 20.12): no Hash object per request. Older Node 20 releases fall back to createHash;
// both give the same digest.
const oneShot = (crypto as { hash?: (algorithm: string, data: string, encoding: 'base64url') => string })
  .hash;

/**
 * The default request fingerprint: SHA-256 over method, path, query (parameters sorted) and body. A parsed body
 * (object or array) is hashed as canonical JSON with sorted keys, so `{"a":1,"b":2}` and `{"b":2,"a":1}` match;
 * a Buffer or string body is hashed as its bytes.
 */
export function defaultFingerprint(method: string, url: string, body: unknown): string {
  const q = url.indexOf('?');
  const head = `${method}\n${q === -1 ? url : url.slice(0, q)}\n${q !== -1 && q < url.length - 1 ? canonicalQuery(url.slice(q + 1)) : ''}\n`;
  if (body instanceof Uint8Array)
    return crypto.createHash('sha256').update(head).update(body).digest('base64url');
  const text =
    body === undefined || body === null ? '' : typeof body === 'string' ? body : canonicalJson(body);
  return oneShot !== undefined
    ? oneShot('sha256', head + text, 'base64url')
    : crypto
        .createHash('sha256')
        .update(head + text)
        .digest('base64url');
}

function canonicalQuery(query: string): string {
  const params = new URLSearchParams(query);
  params.sort();
  return params.toString();
}

/** JSON with object keys sorted at every depth; otherwise what `JSON.stringify` would write. */
export function canonicalJson(value: unknown): string {
  // Most bodies already have their keys in order (clients serialise one way): then the native stringify writes
  // the canonical form in about half the time of building it.
  if (isCanonical(value, 0)) return JSON.stringify(value) ?? 'null';
  return buildCanonical(value);
}

/**
 * Whether `JSON.stringify(value)` is already canonical: every object's own keys in sorted order (as
 * `Object.keys` and `JSON.stringify` list them, integer-like keys first), and no `toJSON` whose result would
 * need sorting. Values JSON drops or writes as null (undefined, functions, symbols) are treated alike by both.
 * Anything else (class instances, boxed primitives, very deep or cyclic values) takes the slow path.
 */
function isCanonical(value: unknown, depth: number): boolean {
  if (value === null || typeof value !== 'object') return true;
  if (depth > 32 || typeof (value as { toJSON?: unknown }).toJSON === 'function') return false;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) if (!isCanonical(value[i], depth + 1)) return false;
    return true;
  }
  // Only plain objects (what a JSON parser makes): JSON.stringify writes a boxed number or a Map otherwise.
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) return false;
  let previous: string | undefined;
  for (const key in value) {
    // An inherited enumerable key is not one JSON.stringify writes: let the slow path decide.
    if (!Object.hasOwn(value, key)) return false;
    if (previous !== undefined && previous >= key) return false;
    previous = key;
    if (!isCanonical((value as Record<string, unknown>)[key], depth + 1)) return false;
  }
  return true;
}

/**
 * A container `buildCanonical` is writing: an array, or an object with its keys sorted; `next` is what comes next,
 * `written` whether a member was (an object skips undefined members, so `next` cannot tell).
 */
interface OpenContainer {
  items: unknown[] | Record<string, unknown>;
  keys: string[] | undefined;
  next: number;
  written: boolean;
}

// From this depth on, each container opened is checked against those still open: a value that contains itself (no
// JSON parser makes one) would otherwise be written forever. Below it no parsed body pays for the check.
const CYCLE_CHECK_DEPTH = 1_000;
// A toJSON() that returns an object with a toJSON() of its own, and so on: past this, taken for a loop.
const MAX_TO_JSON_CHAIN = 100;

/**
 * The canonical form, built with a stack of its own rather than by recursion: a parsed body may nest deeper than the
 * call stack goes (10 KB of `[`...`]` is 5,000 levels, which `JSON.parse` and body parsers accept), and a fingerprint
 * must not fail where the parser did not. The output is exactly the recursive version's (a test keeps that one as
 * its oracle): stored fingerprints stay valid across versions.
 */
function buildCanonical(root: unknown): string {
  const open: OpenContainer[] = [];
  let ancestors: Set<object> | undefined;
  let out = '';
  let value = root;
  for (;;) {
    // Write `value`: a primitive whole, a container its opening bracket.
    for (let chain = 0; value !== null && typeof value === 'object'; chain++) {
      const withToJson = value as { toJSON?: () => unknown };
      if (typeof withToJson.toJSON !== 'function') break;
      if (chain === MAX_TO_JSON_CHAIN)
        throw new ValueOutOfRangeError('canonicalJson: toJSON() results chain without end');
      value = withToJson.toJSON();
    }
    if (value === null || typeof value !== 'object') {
      out += JSON.stringify(value) ?? 'null';
    } else {
      if (open.length >= CYCLE_CHECK_DEPTH) {
        ancestors ??= new Set(open.map((container) => container.items));
        if (ancestors.has(value))
          throw new InvalidValueError('canonicalJson: the value contains itself (a cycle)');
        ancestors.add(value);
      }
      if (Array.isArray(value)) {
        out += '[';
        open.push({ items: value, keys: undefined, next: 0, written: false });
      } else {
        out += '{';
        open.push({
          items: value as Record<string, unknown>,
          keys: Object.keys(value).sort(),
          next: 0,
          written: false,
        });
      }
    }
    // Find the next value to write, closing each container that has none left.
    let more = false;
    while (!more && open.length > 0) {
      const top = open[open.length - 1] as OpenContainer;
      if (top.keys === undefined) {
        const items = top.items as unknown[];
        if (top.next < items.length) {
          if (top.next > 0) out += ',';
          value = items[top.next++];
          more = true;
        } else {
          out += ']';
          ancestors?.delete(top.items);
          open.pop();
        }
        continue;
      }
      const record = top.items as Record<string, unknown>;
      while (top.next < top.keys.length) {
        const key = top.keys[top.next++] as string;
        const item = record[key];
        if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
        out += `${top.written ? ',' : ''}${JSON.stringify(key)}:`;
        top.written = true;
        value = item;
        more = true;
        break;
      }
      if (!more) {
        out += '}';
        ancestors?.delete(top.items);
        open.pop();
      }
    }
    if (!more) return out;
  }
}
