// One OpenTelemetry setup for every benchmark that measures it: `otel()` over an SDK MeterProvider whose exporter
// drops everything, so the figures are what OpenTelemetry costs the request path (instruments, attributes, the SDK's
// aggregation) without an exporter's I/O. The reader collects every second.
export async function otelOptions() {
  const { otel } = await import('@oncely/opentelemetry');
  const { MeterProvider, PeriodicExportingMetricReader } = await import('@opentelemetry/sdk-metrics');
  const exporter = {
    export: (_metrics: unknown, done: (result: { code: 0 }) => void) => done({ code: 0 }),
    forceFlush: async () => {},
    shutdown: async () => {},
  };
  const meterProvider = new MeterProvider({
    readers: [new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 1000 })],
  });
  return otel({ meterProvider });
}
