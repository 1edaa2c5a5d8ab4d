import { createHash } from 'node:crypto';

/**
 * The default request fingerprint: SHA-256 over method, path, query (parameters sorted) and body. A parsed body
 * (object or array) is hashed as canonical JSON with sorted keys, so `{"a":1,"b":2}` and `{"b":2,"a":1}` match;
 * a Buffer or string body is hashed as its bytes.
 */
export function defaultFingerprint(method: string, url: string, body: unknown): string {
  const hash = createHash('sha256');
  const q = url.indexOf('?');
  hash.update(method);
  hash.update('\n');
  hash.update(q === -1 ? url : url.slice(0, q));
  hash.update('\n');
  if (q !== -1 && q < url.length - 1) hash.update(canonicalQuery(url.slice(q + 1)));
  hash.update('\n');
  if (body === undefined || body === null) {
    // no body
  } else if (typeof body === 'string') {
    hash.update(body);
  } else if (body instanceof Uint8Array) {
    hash.update(body);
  } else {
    hash.update(canonicalJson(body));
  }
  return hash.digest('base64url');
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
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const record = value as Record<string, unknown>;
  const parts: string[] = [];
  for (const key of Object.keys(record).sort()) {
    const item = record[key];
    if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
    parts.push(`${JSON.stringify(key)}:${canonicalJson(item)}`);
  }
  return `{${parts.join(',')}}`;
}
