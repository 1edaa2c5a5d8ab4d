// Sample events in the shapes AWS documents (types from @types/aws-lambda), and a Context.
import type { APIGatewayProxyEventV2, Context, SQSEvent, SQSRecord } from 'aws-lambda';

export function httpApiRequest(key: string, body: unknown): APIGatewayProxyEventV2 {
  return {
    version: '2.0',
    routeKey: 'POST /charges',
    rawPath: '/charges',
    rawQueryString: '',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    requestContext: {
      accountId: '123456789012',
      apiId: 'example',
      domainName: 'example.execute-api.eu-west-1.amazonaws.com',
      domainPrefix: 'example',
      http: {
        method: 'POST',
        path: '/charges',
        protocol: 'HTTP/1.1',
        sourceIp: '192.0.2.1',
        userAgent: 'curl/8',
      },
      requestId: `req-${key}`,
      routeKey: 'POST /charges',
      stage: '$default',
      time: new Date().toUTCString(),
      timeEpoch: Date.now(),
    },
    body: JSON.stringify(body),
    isBase64Encoded: false,
  };
}

export function sqsRecord(messageId: string, body: unknown): SQSRecord {
  return {
    messageId,
    receiptHandle: `receipt-${messageId}`,
    body: JSON.stringify(body),
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: String(Date.now()),
      SenderId: 'AIDAEXAMPLE',
      ApproximateFirstReceiveTimestamp: String(Date.now()),
    },
    messageAttributes: {},
    md5OfBody: '',
    eventSource: 'aws:sqs',
    eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:orders',
    awsRegion: 'eu-west-1',
  };
}

export const sqsBatch = (...records: SQSRecord[]): SQSEvent => ({ Records: records });

/** A Context as Lambda passes it, with 30 s left. */
export function lambdaContext(requestId: string): Context {
  const deadline = Date.now() + 30_000;
  return {
    callbackWaitsForEmptyEventLoop: true,
    functionName: 'oncely-example',
    functionVersion: '$LATEST',
    invokedFunctionArn: 'arn:aws:lambda:eu-west-1:123456789012:function:oncely-example',
    memoryLimitInMB: '512',
    awsRequestId: requestId,
    logGroupName: '/aws/lambda/oncely-example',
    logStreamName: 'local',
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => {},
    fail: () => {},
    succeed: () => {},
  };
}
