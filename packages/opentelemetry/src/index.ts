/**
 * OpenTelemetry metrics and traces for oncely: `otel()` gives the hooks that record decisions, store operation
 * durations, waits and executions in flight.
 *
 * @module @oncely/opentelemetry
 */
import {
  type AdapterKind,
  composeHooks,
  type DecisionEvent,
  type DecisionOutcome,
  type ExecutionEvent,
  type IdempotencyHooks,
  IdempotencyOptionsError,
  type StepEvent,
  type StoreOperation,
  type StoreOperationEvent,
  type UnconfirmedWriteEvent,
} from '@oncely/core';
import { OBSERVERS } from '@oncely/core/adapter';
import {
  type Attributes,
  context,
  type Histogram,
  type Meter,
  type MeterProvider,
  metrics,
  type ObservableResult,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  type TracerProvider,
  trace,
} from '@opentelemetry/api';

/** The instrumentation scope name of every meter and tracer this package makes. */
export const INSTRUMENTATION_NAME = '@oncely/opentelemetry';
/** The instrumentation scope version (this package's version). */
export const INSTRUMENTATION_VERSION = '0.0.0';

/** Metric names (OpenTelemetry style; the Prometheus exporter writes dots as underscores and adds unit suffixes). */
export const METRICS = {
  /** Counter of the decisions made for requests and messages, by `oncely.outcome` and `oncely.adapter`. */
  decisions: 'oncely.decisions',
  /** Histogram of store operation durations, in seconds. */
  storeDuration: 'oncely.store.operation.duration',
  /** Histogram of the waits for a held key (`inProgress: { wait }`), in seconds. */
  waitDuration: 'oncely.wait.duration',
  /** Up-down counter of the executions (handlers, consumer functions) running now. */
  activeExecutions: 'oncely.executions.active',
  /** Counter of the store writes left unconfirmed (fewer replicas confirmed them than asked). */
  unconfirmedWrites: 'oncely.store.unconfirmed_writes',
  /** Counter of the unconfirmed writes that ended, by how (`oncely.unconfirmed.outcome`). */
  unconfirmedWritesEnded: 'oncely.store.unconfirmed_writes.ended',
  /** Counter of the steps of executions, by `oncely.step.outcome`. */
  steps: 'oncely.steps',
} as const;

/** Attribute names used on metrics and spans. None ever carries a key, a scope or anything from a request body. */
export const ATTRIBUTES = {
  /** The decision's outcome: one of `OtelOutcome`. */
  outcome: 'oncely.outcome',
  /** Who decided: `http` (the engine) or `consumer` (`idempotent()` and the broker wrappers). */
  adapter: 'oncely.adapter',
  /** On the active span: `true` when the answer is a replay. */
  replayed: 'oncely.replayed',
  /** The store operation: `acquire`, `complete`, `release`, `renew` or `recordStep`. */
  storeOperation: 'oncely.store.operation',
  /** How the store operation went: `ok` or `error`. */
  storeResult: 'oncely.store.result',
  /** On store operation spans: the store's class name (`RedisStore`), or `custom`. */
  storeKind: 'oncely.store.kind',
  /** On `oncely.store.unconfirmed_writes.ended`: how it ended (`confirmed`, `lost`, `expired`, `gave_up`). */
  unconfirmedOutcome: 'oncely.unconfirmed.outcome',
  /**
   * On `oncely.steps` and the `oncely.step` span event: `run` (the step's function ran and its result was recorded)
   * or `replayed`. The step's name is never an attribute: code may build names from data (one per item), which
   * would make a series per name.
   */
  stepOutcome: 'oncely.step.outcome',
  /**
   * OpenTelemetry's own `error.type`, set on a store operation's duration and span only when it failed: the class
   * name of what the store threw, or `_OTHER`.
   */
  errorType: 'error.type',
} as const;

/** Every value of the decisions counter's `oncely.outcome`: the engine's decisions, plus `fenced` and `released`. */
export type OtelOutcome = DecisionOutcome | 'fenced' | 'released';

/** Options of `otel()` and `otelHooks()`. */
export interface OtelOptions {
  /** Where the meter comes from. Default: the global one (`metrics.getMeterProvider()`), read at the first event. */
  meterProvider?: MeterProvider;
  /** Where the tracer comes from. Default: the global one (`trace.getTracerProvider()`). */
  tracerProvider?: TracerProvider;
  /** Record metrics. Default: `true`. */
  metrics?: boolean;
  /**
   * Annotate the active span (the HTTP server span, the message's span) with the outcome and add a child span per
   * store operation. Spans are only started under a recording parent: none when no tracer provider is registered.
   * Default: `true`.
   */
  traces?: boolean;
  /** Your own hooks, run before OpenTelemetry's (an exception in one never stops the other). Default: none. */
  hooks?: IdempotencyHooks;
}

/** What `otel()` returns: spread it into an engine's, `idempotent()`'s or a broker wrapper's options. */
export interface OtelOptionsFragment {
  /** The hooks OpenTelemetry adds, kept beside the options' own `hooks` rather than in their place. */
  readonly [OBSERVERS]: readonly IdempotencyHooks[];
}

// Seconds. Memory stores answer in microseconds, networked ones in milliseconds; timeouts end at seconds.
const STORE_BUCKETS = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];
const WAIT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

const OUTCOMES: readonly OtelOutcome[] = [
  'executed',
  'replayed',
  'conflict',
  'mismatch',
  'rejected',
  'store_error',
  'fenced',
  'released',
];
const ADAPTERS: readonly AdapterKind[] = ['http', 'consumer'];
const STORE_OPERATIONS: readonly StoreOperation[] = ['acquire', 'complete', 'release', 'renew', 'recordStep'];
const STEP_OUTCOMES: readonly StepEvent['outcome'][] = ['run', 'replayed'];
const UNCONFIRMED_OPERATIONS: readonly UnconfirmedWriteEvent['operation'][] = ['complete', 'release'];
const UNCONFIRMED_OUTCOMES: readonly UnconfirmedWriteEvent['outcome'][] = [
  'unconfirmed',
  'confirmed',
  'lost',
  'expired',
  'gave_up',
];
/** How an unconfirmed write ended: every outcome but the opening (`unconfirmed`), counted apart. */
const UNCONFIRMED_ENDINGS = UNCONFIRMED_OUTCOMES.filter((outcome) => outcome !== 'unconfirmed');

const KNOWN_OPTIONS = new Set(['meterProvider', 'tracerProvider', 'metrics', 'traces', 'hooks']);

/**
 * The instruments of one meter, shared by every otel() that records to it. The decisions counter and the executions
 * in flight are counted here in plain numbers and reported by observable instruments when the SDK collects: an SDK
 * `add()` or `record()` hashes its attributes on every call, and a first execution made three `add()`s, where an
 * increment here costs a few ns (docs/benchmarks.md, "OpenTelemetry"). Histograms have no observable form:
 * durations are recorded as they come, with one attribute (two when the operation failed; see buildHooks).
 */
interface Instruments {
  decisions: Record<AdapterKind, Record<OtelOutcome, number>>;
  active: Record<AdapterKind, number>;
  /** Adapter kinds seen so far: only they are reported (all their outcomes, zeros included, so rates exist). */
  seen: Record<AdapterKind, boolean>;
  storeDuration: Histogram;
  waitDuration: Histogram;
  /** Unconfirmed writes by adapter, operation and outcome; reported once one was seen (a rare event). */
  unconfirmed: Record<
    AdapterKind,
    Record<'complete' | 'release', Record<UnconfirmedWriteEvent['outcome'], number>>
  >;
  unconfirmedSeen: boolean;
  /** Steps by adapter and outcome; an adapter kind is reported once it ran or replayed a step. */
  steps: Record<AdapterKind, Record<StepEvent['outcome'], number>>;
  stepsSeen: Record<AdapterKind, boolean>;
}

const instrumentsByMeter = new WeakMap<Meter, Instruments>();

// Attribute sets are made once and reused: no allocation per event.
const DECISION_ATTRIBUTES = table(ADAPTERS, (adapter) =>
  table(OUTCOMES, (outcome) => freeze({ [ATTRIBUTES.outcome]: outcome, [ATTRIBUTES.adapter]: adapter })),
);
const ADAPTER_ATTRIBUTES = table(ADAPTERS, (adapter) => freeze({ [ATTRIBUTES.adapter]: adapter }));
const STEP_ATTRIBUTES = table(ADAPTERS, (adapter) =>
  table(STEP_OUTCOMES, (outcome) =>
    freeze({ [ATTRIBUTES.stepOutcome]: outcome, [ATTRIBUTES.adapter]: adapter }),
  ),
);
const STEP_EVENT_ATTRIBUTES = table(STEP_OUTCOMES, (outcome) =>
  freeze({ [ATTRIBUTES.stepOutcome]: outcome }),
);
const UNCONFIRMED_ATTRIBUTES = table(ADAPTERS, (adapter) =>
  table(UNCONFIRMED_OPERATIONS, (operation) =>
    freeze({ [ATTRIBUTES.adapter]: adapter, [ATTRIBUTES.storeOperation]: operation }),
  ),
);
const UNCONFIRMED_ENDED_ATTRIBUTES = table(ADAPTERS, (adapter) =>
  table(UNCONFIRMED_OPERATIONS, (operation) =>
    table(UNCONFIRMED_OUTCOMES, (outcome) =>
      freeze({
        [ATTRIBUTES.adapter]: adapter,
        [ATTRIBUTES.storeOperation]: operation,
        [ATTRIBUTES.unconfirmedOutcome]: outcome,
      }),
    ),
  ),
);

function instrumentsOf(meter: Meter): Instruments {
  const existing = instrumentsByMeter.get(meter);
  if (existing !== undefined) return existing;
  const instruments: Instruments = {
    decisions: table(ADAPTERS, () => table(OUTCOMES, () => 0)),
    active: table(ADAPTERS, () => 0),
    seen: table(ADAPTERS, () => false),
    storeDuration: meter.createHistogram(METRICS.storeDuration, {
      description: 'Duration of idempotency store operations',
      unit: 's',
      advice: { explicitBucketBoundaries: STORE_BUCKETS },
    }),
    waitDuration: meter.createHistogram(METRICS.waitDuration, {
      description: 'Time a request or message waited for the key held by another (inProgress: { wait })',
      unit: 's',
      advice: { explicitBucketBoundaries: WAIT_BUCKETS },
    }),
    unconfirmed: table(ADAPTERS, () =>
      table(UNCONFIRMED_OPERATIONS, () => table(UNCONFIRMED_OUTCOMES, () => 0)),
    ),
    unconfirmedSeen: false,
    steps: table(ADAPTERS, () => table(STEP_OUTCOMES, () => 0)),
    stepsSeen: table(ADAPTERS, () => false),
  };
  meter
    .createObservableCounter(METRICS.decisions, {
      description: 'Idempotency decisions, by outcome and adapter kind',
      unit: '{decision}',
    })
    .addCallback((result) =>
      observeByOutcome(result, instruments.seen, OUTCOMES, instruments.decisions, DECISION_ATTRIBUTES),
    );
  meter
    .createObservableUpDownCounter(METRICS.activeExecutions, {
      description: 'Handlers and consumer functions running under an idempotency key',
      unit: '{execution}',
    })
    .addCallback((result) => {
      for (const adapter of ADAPTERS) {
        if (instruments.seen[adapter])
          result.observe(instruments.active[adapter], ADAPTER_ATTRIBUTES[adapter]);
      }
    });
  meter
    .createObservableCounter(METRICS.unconfirmedWrites, {
      description:
        'Completions and releases the store wrote but its replicas did not confirm in time (re-sent until they do)',
      unit: '{write}',
    })
    .addCallback((result) => {
      if (!instruments.unconfirmedSeen) return;
      for (const adapter of ADAPTERS)
        for (const operation of UNCONFIRMED_OPERATIONS)
          result.observe(
            instruments.unconfirmed[adapter][operation].unconfirmed,
            UNCONFIRMED_ATTRIBUTES[adapter][operation],
          );
    });
  meter
    .createObservableCounter(METRICS.unconfirmedWritesEnded, {
      description:
        'How the unconfirmed completions and releases ended (confirmed, lost, expired, gave_up): the writes of oncely.store.unconfirmed_writes, once each',
      unit: '{write}',
    })
    .addCallback((result) => {
      if (!instruments.unconfirmedSeen) return;
      for (const adapter of ADAPTERS)
        for (const operation of UNCONFIRMED_OPERATIONS)
          for (const outcome of UNCONFIRMED_ENDINGS)
            result.observe(
              instruments.unconfirmed[adapter][operation][outcome],
              UNCONFIRMED_ENDED_ATTRIBUTES[adapter][operation][outcome],
            );
    });
  meter
    .createObservableCounter(METRICS.steps, {
      description:
        'Steps of executions (step(name, fn)), by outcome: run (its function ran and its result was recorded) or replayed (recorded by an earlier attempt of the key)',
      unit: '{step}',
    })
    .addCallback((result) =>
      observeByOutcome(result, instruments.stepsSeen, STEP_OUTCOMES, instruments.steps, STEP_ATTRIBUTES),
    );
  instrumentsByMeter.set(meter, instruments);
  return instruments;
}

/**
 * Turns OpenTelemetry on for an engine, `idempotent()` or a broker wrapper:
 * `idempotency({ ...options, ...otel() })`. It adds its hooks beside the options' own `hooks` (in any spread
 * order), never in their place. Depends on `@opentelemetry/api` only: the SDK and exporters are yours to set up.
 */
export function otel(options: OtelOptions = {}): OtelOptionsFragment {
  return { [OBSERVERS]: [otelHooks(options)] };
}

/**
 * The same as `otel()`, as a hooks object: `hooks: otelHooks({ hooks: myHooks })`, or
 * `hooks: composeHooks(myHooks, otelHooks())`.
 */
export function otelHooks(options: OtelOptions = {}): IdempotencyHooks {
  const o = checkOptions(options);
  const ours = o.metrics || o.traces ? buildHooks(o) : {};
  return o.hooks === undefined ? ours : composeHooks(o.hooks, ours);
}

interface Checked {
  meterProvider: MeterProvider | undefined;
  tracerProvider: TracerProvider | undefined;
  metrics: boolean;
  traces: boolean;
  hooks: IdempotencyHooks | undefined;
}

function checkOptions(options: OtelOptions): Checked {
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'otel options',
      'must be an object; pass {} or leave it out for the defaults.',
    );
  }
  for (const name of Object.keys(options)) {
    if (!KNOWN_OPTIONS.has(name)) {
      throw new IdempotencyOptionsError(
        name,
        `is not an option of otel(); known options: ${[...KNOWN_OPTIONS].join(', ')}.`,
      );
    }
  }
  for (const name of ['metrics', 'traces'] as const) {
    const value = options[name];
    if (value !== undefined && typeof value !== 'boolean') {
      throw new IdempotencyOptionsError(name, `must be true or false; got ${JSON.stringify(value)}.`);
    }
  }
  if (options.meterProvider !== undefined && typeof options.meterProvider?.getMeter !== 'function') {
    throw new IdempotencyOptionsError(
      'meterProvider',
      'must be an OpenTelemetry MeterProvider (from @opentelemetry/sdk-metrics), or left out for the global one.',
    );
  }
  if (options.tracerProvider !== undefined && typeof options.tracerProvider?.getTracer !== 'function') {
    throw new IdempotencyOptionsError(
      'tracerProvider',
      'must be an OpenTelemetry TracerProvider (from @opentelemetry/sdk-trace-base), or left out for the global one.',
    );
  }
  const hooks = options.hooks;
  if (hooks !== undefined && (hooks === null || typeof hooks !== 'object')) {
    throw new IdempotencyOptionsError('hooks', 'must be an object of callbacks such as { onHit(event) {} }.');
  }
  return {
    meterProvider: options.meterProvider,
    tracerProvider: options.tracerProvider,
    metrics: options.metrics ?? true,
    traces: options.traces ?? true,
    hooks,
  };
}

function buildHooks(o: Checked): IdempotencyHooks {
  // The histogram's attributes: the operation, and `error.type` only when it failed (as OpenTelemetry's own client
  // durations do). The SDK hashes a measurement's attributes on every record(), at a cost that grows with each
  // attribute (docs/benchmarks.md, "OpenTelemetry"). The store kind and adapter are constant for most engines: the
  // spans carry them.
  const storeMetricAttributes = table(STORE_OPERATIONS, (operation) =>
    freeze({ [ATTRIBUTES.storeOperation]: operation }),
  );
  // Failures, by operation and error type: few of each (class names), made once.
  const failedMetricAttributes = new Map<string, Attributes>();
  const metricAttributesOf = (e: StoreOperationEvent): Attributes => {
    if (e.result === 'ok') return storeMetricAttributes[e.operation];
    // Class names are bounded by the code; past 64 distinct ones, the rest are _OTHER all the same.
    const errorType = e.errorType === undefined || failedMetricAttributes.size >= 64 ? '_OTHER' : e.errorType;
    const id = `${e.operation}\u0000${errorType}`;
    let attributes = failedMetricAttributes.get(id);
    if (attributes === undefined) {
      attributes = freeze({ [ATTRIBUTES.storeOperation]: e.operation, [ATTRIBUTES.errorType]: errorType });
      failedMetricAttributes.set(id, attributes);
    }
    return attributes;
  };
  // Spans keep the real error type (a span's attributes are not series), so the cache is what must stay bounded:
  // past 256 combinations, attributes are made per span and not kept.
  const storeSpanAttributes = new Map<string, Attributes>();
  const storeSpanAttributesOf = (e: StoreOperationEvent): Attributes => {
    const id = `${e.adapter}\u0000${e.operation}\u0000${e.result}\u0000${e.store}\u0000${e.errorType}`;
    let attributes = storeSpanAttributes.get(id);
    if (attributes === undefined) {
      attributes = freeze({
        [ATTRIBUTES.adapter]: e.adapter,
        [ATTRIBUTES.storeOperation]: e.operation,
        [ATTRIBUTES.storeResult]: e.result,
        [ATTRIBUTES.storeKind]: e.store,
        ...(e.result === 'error' ? { [ATTRIBUTES.errorType]: e.errorType ?? '_OTHER' } : {}),
      });
      if (storeSpanAttributes.size < 256) storeSpanAttributes.set(id, attributes);
    }
    return attributes;
  };

  // Instruments are found at the first event, so otel() may run before the SDK is started.
  let instruments: Instruments | undefined;
  const get = (): Instruments =>
    (instruments ??= instrumentsOf(
      (o.meterProvider ?? metrics.getMeterProvider()).getMeter(INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION),
    ));
  let tracer: Tracer | undefined;
  const getTracer = (): Tracer =>
    (tracer ??= (o.tracerProvider ?? trace.getTracerProvider()).getTracer(
      INSTRUMENTATION_NAME,
      INSTRUMENTATION_VERSION,
    ));

  const count = (adapter: AdapterKind | undefined, outcome: OtelOutcome): void => {
    const i = get();
    const kind = adapter ?? 'http';
    i.seen[kind] = true;
    i.decisions[kind][outcome]++;
  };

  const hooks: IdempotencyHooks = {
    onDecision(event: DecisionEvent) {
      if (o.metrics) {
        count(event.adapter, event.outcome);
        if (event.waitedMs !== undefined) {
          get().waitDuration.record(event.waitedMs / 1000, DECISION_ATTRIBUTES[event.adapter][event.outcome]);
        }
      }
      if (o.traces) {
        const span = trace.getActiveSpan();
        if (span?.isRecording()) {
          span.setAttribute(ATTRIBUTES.outcome, event.outcome);
          span.setAttribute(ATTRIBUTES.replayed, event.outcome === 'replayed');
        }
      }
    },
    onFenced(event) {
      if (o.metrics) count(event.adapter, 'fenced');
      if (o.traces) {
        const span = trace.getActiveSpan();
        if (span?.isRecording())
          span.addEvent('oncely.fenced', { [ATTRIBUTES.storeOperation]: event.operation });
      }
    },
    onRelease(event) {
      if (o.metrics) count(event.adapter, 'released');
      if (o.traces) {
        const span = trace.getActiveSpan();
        if (span?.isRecording()) span.addEvent('oncely.released', { 'oncely.release.reason': event.reason });
      }
    },
    onStep(event: StepEvent) {
      if (o.metrics) {
        const i = get();
        const byOutcome = i.steps[event.adapter];
        if (byOutcome !== undefined && event.outcome in byOutcome) {
          i.stepsSeen[event.adapter] = true;
          byOutcome[event.outcome]++;
        }
      }
      if (o.traces) {
        const span = trace.getActiveSpan();
        const attributes = STEP_EVENT_ATTRIBUTES[event.outcome];
        if (attributes !== undefined && span?.isRecording()) span.addEvent('oncely.step', attributes);
      }
    },
    onUnconfirmedWrite(event: UnconfirmedWriteEvent) {
      if (o.metrics) {
        const i = get();
        const byOutcome = i.unconfirmed[event.adapter]?.[event.operation];
        if (byOutcome !== undefined && event.outcome in byOutcome) {
          i.unconfirmedSeen = true;
          byOutcome[event.outcome]++;
        }
      }
      // The opening only: the ending comes after the request's span has ended, with no span to record it on.
      if (o.traces && event.outcome === 'unconfirmed') {
        const span = trace.getActiveSpan();
        if (span?.isRecording())
          span.addEvent('oncely.unconfirmed_write', { [ATTRIBUTES.storeOperation]: event.operation });
      }
    },
    onStoreOperation(event: StoreOperationEvent) {
      if (o.metrics) {
        get().storeDuration.record(event.durationMs / 1000, metricAttributesOf(event));
      }
      if (o.traces) {
        // A child of the active span only: no parent that records, no span (and no work beyond this check).
        const parent = context.active();
        if (!trace.getSpan(parent)?.isRecording()) return;
        const end = performance.timeOrigin + performance.now();
        const span = getTracer().startSpan(
          `oncely.store ${event.operation}`,
          {
            kind: SpanKind.CLIENT,
            startTime: end - event.durationMs,
            attributes: storeSpanAttributesOf(event),
          },
          parent,
        );
        if (event.result === 'error') span.setStatus({ code: SpanStatusCode.ERROR });
        span.end(end);
      }
    },
  };
  if (o.metrics) {
    hooks.onExecutionStart = (event: ExecutionEvent) => {
      const i = get();
      i.seen[event.adapter] = true;
      i.active[event.adapter]++;
    };
    hooks.onExecutionEnd = (event: ExecutionEvent) => {
      get().active[event.adapter]--;
    };
  }
  return hooks;
}

/** Reports a counter by adapter kind and outcome: every outcome, zeros included, of each adapter kind seen. */
function observeByOutcome<O extends string>(
  result: ObservableResult,
  seen: Record<AdapterKind, boolean>,
  outcomes: readonly O[],
  counts: Record<AdapterKind, Record<O, number>>,
  attributes: Record<AdapterKind, Record<O, Attributes>>,
): void {
  for (const adapter of ADAPTERS) {
    if (!seen[adapter]) continue;
    for (const outcome of outcomes) result.observe(counts[adapter][outcome], attributes[adapter][outcome]);
  }
}

function table<K extends string, V>(keys: readonly K[], make: (key: K) => V): Record<K, V> {
  const out = {} as Record<K, V>;
  for (const key of keys) out[key] = make(key);
  return out;
}

function freeze(attributes: Attributes): Attributes {
  return Object.freeze(attributes);
}
