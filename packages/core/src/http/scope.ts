import { createHmac } from 'node:crypto';
import { IdempotencyOptionsError } from '../shared/errors';
import { TOKEN } from './headers';

/** A request whose headers `scopeByHeader` can read: Node's lower-cased header object, or a web `Headers`. */
export interface RequestWithHeaders {
  /** The request's headers: an object keyed by lower-case name, or a web `Headers`. */
  headers:
    | Readonly<Record<string, string | readonly string[] | undefined>>
    | {
        /** The header's value, or `null` when the request has none. */
        get(name: string): string | null;
      };
}

/** Options of `scopeByHeader`. */
export interface ScopeByHeaderOptions {
  /**
   * Key of the HMAC over the header's value: at least 16 bytes, and the same on every process that shares the
   * store (from configuration, e.g. `process.env.ONCELY_SCOPE_SECRET`), or a retry that reaches another process
   * lands in another scope and runs again. Changing it starts every caller in a new scope. Required.
   */
  secret: string | Uint8Array;
}

/**
 * A `scope` for the case where a credential header identifies the caller and stays the same between a request and
 * its retry (an API key): `scope: scopeByHeader('authorization', { secret })`. The scope is `<header>:` and an
 * HMAC-SHA256 of the header's value keyed by `secret`, so no credential reaches a record key, a log line or a
 * hook. Requests without the header share the scope `<header>:none`.
 *
 * Wrong for credentials that change between a request and its retry (short-lived OAuth access tokens, session
 * cookies that rotate): a retry after a refresh lands in a new scope and runs again. Scope by the user id your
 * authentication established instead (docs/security.md).
 */
export function scopeByHeader(
  header: string,
  options: ScopeByHeaderOptions,
): (request: RequestWithHeaders) => string {
  if (typeof header !== 'string' || !TOKEN.test(header)) {
    throw new IdempotencyOptionsError(
      'scopeByHeader(header)',
      `must be a header name such as 'authorization' or 'x-api-key'; got ${JSON.stringify(header)}.`,
    );
  }
  const secret = (options as Partial<ScopeByHeaderOptions> | undefined)?.secret;
  const key: string | Buffer | undefined =
    typeof secret === 'string'
      ? secret
      : // Copied, so a caller reusing its buffer cannot change scopes later.
        secret instanceof Uint8Array
        ? Buffer.from(secret)
        : undefined;
  const secretBytes = key === undefined ? undefined : Buffer.byteLength(key);
  if (key === undefined || secretBytes === undefined || secretBytes < 16) {
    throw new IdempotencyOptionsError(
      'scopeByHeader({ secret })',
      `must be a string or bytes of at least 16 bytes, the same on every process sharing the store, such as process.env.ONCELY_SCOPE_SECRET; make one with: node -e "console.log(require('node:crypto').randomBytes(32).toString('base64url'))"${secret === undefined ? '' : `; got ${secretBytes === undefined ? typeof secret : `${secretBytes} bytes`}`}.`,
    );
  }
  const name = header.toLowerCase();
  const none = `${name}:none`;
  return function scopeOfHeader(request: RequestWithHeaders): string {
    const headers = request.headers;
    const value =
      typeof headers.get === 'function'
        ? (headers.get as (n: string) => string | null)(name)
        : (headers as Readonly<Record<string, string | readonly string[] | undefined>>)[name];
    if (value === undefined || value === null) return none;
    // A repeated header (Node gives an array for some) is hashed whole, in order: a retry sends the same lines.
    const text = typeof value === 'string' ? value : value.join('\n');
    return `${name}:${createHmac('sha256', key).update(text).digest('base64url')}`;
  };
}
