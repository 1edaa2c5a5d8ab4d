// Events and contexts as AWS documents them (types from @types/aws-lambda), for the HTTP tests.
import { randomUUID } from 'node:crypto';
import type { ALBEvent, APIGatewayProxyEvent, APIGatewayProxyEventV2, Context } from 'aws-lambda';

export interface EventInput {
  method?: string;
  path?: string;
  /** Query parameters; a repeated one as an array. */
  query?: Record<string, string | string[]>;
  /** Headers; a repeated one as an array (sent in multiValueHeaders where the event has them). */
  headers?: Record<string, string | string[]>;
  body?: string | Buffer;
  /** Send the body base64-encoded (a Buffer body always is). */
  base64?: boolean;
  cookies?: string[];
}

function bodyOf(input: EventInput): { body: string | null; isBase64Encoded: boolean } {
  if (input.body === undefined) return { body: null, isBase64Encoded: false };
  if (Buffer.isBuffer(input.body) || input.base64 === true) {
    return { body: Buffer.from(input.body).toString('base64'), isBase64Encoded: true };
  }
  return { body: input.body, isBase64Encoded: false };
}

const first = (v: string | string[]) => (Array.isArray(v) ? (v[v.length - 1] as string) : v);
const all = (v: string | string[]) => (Array.isArray(v) ? v : [v]);

function split(record: Record<string, string | string[]> | undefined) {
  const single: Record<string, string> = {};
  const multi: Record<string, string[]> = {};
  for (const [name, value] of Object.entries(record ?? {})) {
    single[name] = first(value);
    multi[name] = all(value);
  }
  return { single, multi };
}

/** An API Gateway HTTP API event, payload 2.0 (a Function URL's has the same shape). */
export function v2Event(input: EventInput = {}): APIGatewayProxyEventV2 {
  const { body, isBase64Encoded } = bodyOf(input);
  const method = input.method ?? 'POST';
  const path = input.path ?? '/charges';
  const headers: Record<string, string> = {};
  // HTTP API joins a repeated header's values with commas, names lower-case.
  for (const [name, value] of Object.entries(input.headers ?? {}))
    headers[name.toLowerCase()] = all(value).join(',');
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(input.query ?? {}))
    for (const v of all(value)) query.append(name, v);
  const queryParameters: Record<string, string> = {};
  for (const [name, value] of Object.entries(input.query ?? {})) queryParameters[name] = all(value).join(',');
  return {
    version: '2.0',
    routeKey: '$default',
    rawPath: path,
    rawQueryString: query.toString(),
    ...(input.cookies === undefined ? {} : { cookies: input.cookies }),
    headers,
    ...(input.query === undefined ? {} : { queryStringParameters: queryParameters }),
    requestContext: {
      accountId: '123456789012',
      apiId: 'api-id',
      domainName: 'id.execute-api.us-east-1.amazonaws.com',
      domainPrefix: 'id',
      http: { method, path, protocol: 'HTTP/1.1', sourceIp: '192.0.2.1', userAgent: 'test' },
      requestId: randomUUID(),
      routeKey: '$default',
      stage: '$default',
      time: '12/Mar/2020:19:03:58 +0000',
      timeEpoch: Date.now(),
    },
    ...(body === null ? {} : { body }),
    isBase64Encoded,
  };
}

/** An API Gateway REST API proxy event (payload 1.0). */
export function v1Event(input: EventInput = {}): APIGatewayProxyEvent {
  const method = input.method ?? 'POST';
  const path = input.path ?? '/charges';
  const headers = split(input.headers);
  const query = split(input.query);
  return {
    resource: path,
    path,
    httpMethod: method,
    headers: headers.single,
    multiValueHeaders: headers.multi,
    queryStringParameters: input.query === undefined ? null : query.single,
    multiValueQueryStringParameters: input.query === undefined ? null : query.multi,
    pathParameters: null,
    stageVariables: null,
    requestContext: {
      accountId: '123456789012',
      apiId: 'api-id',
      authorizer: {},
      protocol: 'HTTP/1.1',
      httpMethod: method,
      identity: {
        accessKey: null,
        accountId: null,
        apiKey: null,
        apiKeyId: null,
        caller: null,
        clientCert: null,
        cognitoAuthenticationProvider: null,
        cognitoAuthenticationType: null,
        cognitoIdentityId: null,
        cognitoIdentityPoolId: null,
        principalOrgId: null,
        sourceIp: '192.0.2.1',
        user: null,
        userAgent: 'test',
        userArn: null,
      },
      path: `/prod${path}`,
      stage: 'prod',
      requestId: randomUUID(),
      requestTimeEpoch: Date.now(),
      resourceId: 'abc',
      resourcePath: path,
    },
    ...bodyOf(input),
  };
}

/** An ALB target event, with multi-value headers on the target group or not. */
export function albEvent(input: EventInput = {}, multiValue = false): ALBEvent {
  const headers = split(input.headers);
  const query = split(input.query);
  const lower = (r: Record<string, unknown>) =>
    Object.fromEntries(Object.entries(r).map(([k, v]) => [k.toLowerCase(), v]));
  return {
    requestContext: {
      elb: {
        targetGroupArn:
          'arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/lambda-target/abcdefgh',
      },
    },
    httpMethod: input.method ?? 'POST',
    path: input.path ?? '/charges',
    ...(multiValue
      ? {
          multiValueHeaders: lower(headers.multi) as Record<string, string[]>,
          multiValueQueryStringParameters: query.multi,
        }
      : {
          headers: lower(headers.single) as Record<string, string>,
          queryStringParameters: query.single,
        }),
    ...bodyOf(input),
  };
}

/** A Lambda context whose deadline is `remainingMs` from now. */
export function lambdaContext(remainingMs = 30_000): Context {
  const deadline = Date.now() + remainingMs;
  return {
    callbackWaitsForEmptyEventLoop: true,
    functionName: 'charges',
    functionVersion: '$LATEST',
    invokedFunctionArn: 'arn:aws:lambda:us-east-1:123456789012:function:charges',
    memoryLimitInMB: '128',
    awsRequestId: randomUUID(),
    logGroupName: '/aws/lambda/charges',
    logStreamName: 'stream',
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => undefined,
    fail: () => undefined,
    succeed: () => undefined,
  };
}
