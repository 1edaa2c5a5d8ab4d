import type {
  ALBEvent,
  ALBResult,
  APIGatewayProxyEvent,
  APIGatewayProxyEventV2,
  APIGatewayProxyResult,
  APIGatewayProxyStructuredResultV2,
} from 'aws-lambda';

/**
 * The HTTP events oncely covers: API Gateway REST (payload 1.0, also HTTP API's 1.0), HTTP API (payload 2.0),
 * Function URLs (the 2.0 shape) and ALB targets.
 */
export type HttpEvent = APIGatewayProxyEvent | APIGatewayProxyEventV2 | ALBEvent;

/** What oncely answers itself (a replay, a problem) for an event of type `E`: that event's own result format. */
export type ResultFor<E> = E extends ALBEvent
  ? ALBResult
  : E extends APIGatewayProxyEventV2
    ? APIGatewayProxyStructuredResultV2
    : E extends APIGatewayProxyEvent
      ? APIGatewayProxyResult
      : ALBResult | APIGatewayProxyStructuredResultV2 | APIGatewayProxyResult;

/** Which result format an event expects. */
export type EventKind = 'v1' | 'v2' | 'alb';

/** One event as the engine reads it. */
export interface EventRequest {
  kind: EventKind;
  method: string;
  /** Path and query. */
  url: string;
  /** Lower-case names; a header sent more than once (multiValueHeaders) is an array. */
  headers: Record<string, string | string[]>;
  /** The request came with `multiValueHeaders` (an ALB target group with multi-value headers on answers in them). */
  multiValue: boolean;
}

type Loose = Record<string, unknown>;

/** The event's kind, or `undefined` when it is no HTTP event oncely knows. */
export function kindOf(event: unknown): EventKind | undefined {
  if (typeof event !== 'object' || event === null) return undefined;
  const e = event as Loose;
  const context = e.requestContext as Loose | undefined;
  if (typeof context !== 'object' || context === null) return undefined;
  if (typeof context.elb === 'object' && context.elb !== null && typeof e.httpMethod === 'string')
    return 'alb';
  if (e.version === '2.0' && typeof (context.http as Loose | undefined)?.method === 'string') return 'v2';
  if (typeof e.httpMethod === 'string') return 'v1';
  return undefined;
}

/** The method, path and query, and headers of an event of a known kind. */
export function readEvent(event: HttpEvent, kind: EventKind): EventRequest {
  if (kind === 'v2') {
    const e = event as APIGatewayProxyEventV2;
    const headers: Record<string, string | string[]> = {};
    for (const name in e.headers) {
      const value = e.headers[name];
      if (value !== undefined) headers[name.toLowerCase()] = value;
    }
    // Payload 2.0 moves the Cookie header into `cookies`: put back for `scope` functions that read it.
    if (e.cookies !== undefined && e.cookies.length > 0 && headers.cookie === undefined)
      headers.cookie = e.cookies.join('; ');
    const query = e.rawQueryString;
    return {
      kind,
      method: e.requestContext.http.method,
      url: query === undefined || query === '' ? e.rawPath : `${e.rawPath}?${query}`,
      headers,
      multiValue: false,
    };
  }
  const e = event as APIGatewayProxyEvent | ALBEvent;
  const headers: Record<string, string | string[]> = {};
  const multi = e.multiValueHeaders;
  const multiValue = multi !== undefined && multi !== null;
  if (multiValue) {
    for (const name in multi) {
      const values = multi[name];
      if (values === undefined || values.length === 0) continue;
      headers[name.toLowerCase()] = values.length === 1 ? (values[0] as string) : [...values];
    }
  }
  const single = e.headers;
  if (single !== undefined && single !== null) {
    for (const name in single) {
      const value = single[name];
      const lower = name.toLowerCase();
      if (value !== undefined && headers[lower] === undefined) headers[lower] = value;
    }
  }
  return {
    kind,
    method: e.httpMethod,
    url: e.path + queryOf(e, kind),
    headers,
    multiValue,
  };
}

/**
 * The query string: ALB passes its parameters as the client encoded them, API Gateway decoded, so those are
 * encoded again (the fingerprint sorts and normalises the query either way).
 */
function queryOf(e: APIGatewayProxyEvent | ALBEvent, kind: EventKind): string {
  const encode = kind === 'alb' ? (s: string) => s : encodeURIComponent;
  const parts: string[] = [];
  const multi = e.multiValueQueryStringParameters;
  if (multi !== undefined && multi !== null) {
    for (const name in multi) {
      for (const value of multi[name] ?? []) parts.push(`${encode(name)}=${encode(value)}`);
    }
  } else {
    const single = e.queryStringParameters;
    if (single !== undefined && single !== null) {
      for (const name in single) {
        const value = single[name];
        if (value !== undefined) parts.push(`${encode(name)}=${encode(value)}`);
      }
    }
  }
  return parts.length === 0 ? '' : `?${parts.join('&')}`;
}

const JSON_TYPE = /^application\/(?:[\w.+-]*\+)?json\s*(?:;|$)/i;

/**
 * The body as the fingerprint sees it, decoded when `isBase64Encoded`: JSON parsed (key order does not matter,
 * and the record matches one the other adapters make for the same request), anything else as its bytes.
 */
export function bodyOf(event: HttpEvent, headers: Record<string, string | string[]>): unknown {
  const raw: unknown = event.body;
  if (raw === undefined || raw === null || raw === '') return undefined;
  // Parsed already by a middleware before oncely (Middy's http-json-body-parser, which a Middy handler uses before
  // idempotencyMiddleware): hashed as that JSON value, as the same JSON text would be.
  if (typeof raw !== 'string') return raw;
  const bytes = Buffer.from(raw, event.isBase64Encoded ? 'base64' : 'utf8');
  if (bytes.byteLength === 0) return undefined;
  const type = headers['content-type'];
  if (typeof type !== 'string' || !JSON_TYPE.test(type)) return bytes;
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch {
    return bytes;
  }
}
