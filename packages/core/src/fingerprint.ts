import * as crypto from 'node:crypto';

// One-shot hashing (Node >= 20.12): no Hash object per request. With the string building below it took the
// fingerprint from ~10% to ~4% of a Fastify + MemoryStore replay profile (docs/benchmarks.md). Older Node 20
// releases fall back to createHash; both give the same digest.
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
  if (value === null || typeof value !== 'object') {
    const json = JSON.stringify(value);
    return json === undefined ? 'null' : json;
  }
  const withToJson = value as { toJSON?: () => unknown };
  if (typeof withToJson.toJSON === 'function') return canonicalJson(withToJson.toJSON());
  // Built by appending, without intermediate arrays: this runs on every covered request.
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++) out += (i === 0 ? '' : ',') + canonicalJson(value[i]);
    return `${out}]`;
  }
  const record = value as Record<string, unknown>;
  let out = '{';
  for (const key of Object.keys(record).sort()) {
    const item = record[key];
    if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
    out += (out.length === 1 ? '' : ',') + JSON.stringify(key) + ':' + canonicalJson(item);
  }
  return `${out}}`;
}
