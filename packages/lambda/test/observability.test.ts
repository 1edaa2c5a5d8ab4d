import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { MemoryStore } from '@oncely/core';
import { DynamoDBStore } from '@oncely/dynamodb';
import { otel } from '@oncely/opentelemetry';
import { freePort } from '@oncely/testing';
import {
  AggregationTemporality,
  type DataPoint,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import type { APIGatewayProxyStructuredResultV2, SQSRecord } from 'aws-lambda';
import { idempotentBatch, withIdempotency } from '../src';
import { sqsEvent, sqsRecord } from './batch-events';
import { lambdaContext, v2Event } from './http-events';

// What the other adapters promise about observability and outages, through the Lambda wrappers: otel() counts their
// decisions with the real OpenTelemetry SDK, and a store that cannot be reached is a 503 problem, the handler not run.

function meter() {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return {
    meterProvider,
    /** `oncely.decisions` as `<adapter> <outcome>` → count, the non-zero ones. */
    async decisions(): Promise<Record<string, number>> {
      await reader.forceFlush();
      const counted: Record<string, number> = {};
      for (const scope of exporter.getMetrics().at(-1)?.scopeMetrics ?? []) {
        for (const metric of scope.metrics) {
          if (metric.descriptor.name !== 'oncely.decisions') continue;
          for (const point of metric.dataPoints as DataPoint<number>[]) {
            // Every adapter and outcome is reported from zero: only the ones that happened are kept.
            if (point.value === 0) continue;
            counted[`${point.attributes['oncely.adapter']} ${point.attributes['oncely.outcome']}`] =
              point.value;
          }
        }
      }
      return counted;
    },
    shutdown: () => meterProvider.shutdown(),
  };
}

test('otel() counts the HTTP wrapper decisions and the batch decisions', async () => {
  const m = meter();
  try {
    const store = new MemoryStore();
    const http = withIdempotency(async () => ({ statusCode: 201, body: '{"ok":true}' }), {
      store,
      scope: false,
      ...otel({ meterProvider: m.meterProvider }),
    });
    const event = () => v2Event({ headers: { 'Idempotency-Key': 'otel-1' }, body: '{"a":1}' });
    await http(event(), lambdaContext());
    const replay = (await http(event(), lambdaContext())) as APIGatewayProxyStructuredResultV2;
    expect(replay.headers?.['idempotent-replayed']).toBe('true');

    const batch = idempotentBatch(async (_record: SQSRecord) => {}, {
      store,
      ...otel({ meterProvider: m.meterProvider }),
    });
    const first = sqsRecord({ body: 'x', key: 'otel-msg' });
    const resend = sqsRecord({ body: 'x', key: 'otel-msg' });
    expect((await batch(sqsEvent([first]), lambdaContext())).batchItemFailures).toEqual([]);
    expect((await batch(sqsEvent([resend]), lambdaContext())).batchItemFailures).toEqual([]);

    expect(await m.decisions()).toEqual({
      'http executed': 1,
      'http replayed': 1,
      'consumer executed': 1,
      'consumer replayed': 1,
    });
  } finally {
    await m.shutdown();
  }
});

test('an unreachable store answers 503 problem+json at once; the handler does not run', async () => {
  const down = new DynamoDBClient({
    endpoint: `http://127.0.0.1:${await freePort()}`, // nothing listens there
    region: 'us-east-1',
    credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
    maxAttempts: 1,
  });
  try {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return { statusCode: 201, body: '{}' };
      },
      { store: new DynamoDBStore({ client: down, tableName: 'oncely-outage' }), scope: false },
    );
    const result = (await handler(
      v2Event({ headers: { 'Idempotency-Key': 'outage-1' }, body: '{}' }),
      lambdaContext(),
    )) as APIGatewayProxyStructuredResultV2;
    expect(result.statusCode).toBe(503);
    expect(result.headers?.['content-type']).toMatch(/application\/problem\+json/);
    expect(JSON.parse(result.body ?? '{}')).toMatchObject({ status: 503 });
    expect(runs).toBe(0);

    // A batch record meeting the same outage is reported, not run, and the invocation does not throw.
    let recordRuns = 0;
    const batch = idempotentBatch(
      async (_record: SQSRecord) => {
        recordRuns++;
      },
      { store: new DynamoDBStore({ client: down, tableName: 'oncely-outage' }) },
    );
    const record = sqsRecord({ body: 'y' });
    expect((await batch(sqsEvent([record]), lambdaContext())).batchItemFailures).toEqual([
      { itemIdentifier: record.messageId },
    ]);
    expect(recordRuns).toBe(0);
  } finally {
    down.destroy();
  }
});
