/**
 * Marks a stored response whose body was not kept (it outgrew `maxBodyBytes`, or a store could not hold it): only
 * its status is, and its replay is a 410. A store that drops a body it cannot hold sets this header to `'1'` on the
 * record. Since it is among the headers never stored, a handler cannot forge it.
 */
export const OMITTED_BODY_HEADER = 'x-oncely-body-omitted';

/**
 * Response headers never stored nor replayed: cookies belong to the first response only, `date`
 * must be fresh, hop-by-hop headers describe one connection, and `content-length` is recomputed on replay.
 */
export const ALWAYS_EXCLUDED_HEADERS: readonly string[] = [
  'set-cookie',
  'date',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'content-length',
  'idempotent-replayed',
  OMITTED_BODY_HEADER,
];

/** RFC 9110 token characters: what a header name (or a method) may be made of. */
export const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** A response header's value as Node's `res.getHeaders()` gives it; `undefined` values are not sent. */
export type OutgoingHeaderValue = number | string | readonly string[] | undefined;

/**
 * Copies the headers worth replaying: names lower-cased, numbers as strings, excluded names dropped, and those
 * `before` holds with the same value (set by middleware outside oncely before the handler ran) left out.
 */
export function storableHeaders(
  headers: Readonly<Record<string, OutgoingHeaderValue>>,
  excluded: ReadonlySet<string>,
  before?: Readonly<Record<string, OutgoingHeaderValue>>,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || (before !== undefined && before[name] === value)) continue;
    const lower = name.toLowerCase();
    if (excluded.has(lower) || lower.startsWith('proxy-')) continue;
    out[lower] = typeof value === 'object' ? [...value] : String(value);
  }
  return out;
}
