// One handler covered by two registrations: the handlers, the cases run on them and what is checked, shared by
// http-nested.test.ts (in jest) and fixtures/http-nested-middy.ts (Middy, ESM-only, in a process of its own).
import { Router } from '@aws-lambda-powertools/event-handler/http';
import { currentIdempotency, type IdempotencyStore, type Logger, MemoryStore } from '@oncely/core';
import type { APIGatewayProxyEventV2, APIGatewayProxyStructuredResultV2, Context } from 'aws-lambda';
import { idempotencyOf, type LambdaIdempotencyOptions, routerIdempotency } from '../src';
import { lambdaContext, v2Event } from './http-events';

export type Result = APIGatewayProxyStructuredResultV2;
export type Event = APIGatewayProxyEventV2;
export type Invoke = (event: Event, context: Context) => Promise<Result>;
// `scope` functions here ignore what they get: the same options fit the event and the router's request context.
export type Options = LambdaIdempotencyOptions<never>;
export const opts = <E>(options: Options) => options as LambdaIdempotencyOptions<E>;

/**
 * What the handler saw on each run: `keyFor('charge')` (from the execution's key, scope included) through
 * currentIdempotency() and through idempotencyOf(event); `null` where they gave nothing.
 */
export interface Seen {
  runs: number;
  keys: Array<[string | null, string | null]>;
}

function ran(seen: Seen, event: object): void {
  seen.runs++;
  seen.keys.push([
    currentIdempotency()?.keyFor('charge') ?? null,
    idempotencyOf(event)?.keyFor('charge') ?? null,
  ]);
}

/** A Lambda handler of the event. */
export const eventHandler = (seen: Seen) => async (event: Event) => {
  ran(seen, event);
  return { statusCode: 201, headers: { 'x-run': String(seen.runs) }, body: `run ${seen.runs}` };
};

/** A Powertools router with `routerIdempotency` in `app.use()` and/or on the route. */
export function routed(seen: Seen, appWide: Options | undefined, route: Options | undefined): Invoke {
  const app = new Router();
  if (appWide !== undefined) app.use(routerIdempotency(opts(appWide)));
  const handler = async ({ event }: { event: unknown }) => {
    ran(seen, event as object);
    return new Response(`run ${seen.runs}`, { status: 201, headers: { 'x-run': String(seen.runs) } });
  };
  if (route === undefined) app.post('/charges', handler);
  else app.post('/charges', [routerIdempotency(opts(route))], handler);
  return (event, context) => app.resolve(event, context) as Promise<Result>;
}

/**
 * A Powertools router with `routerIdempotency` in `app.use()` (`where: 'app'`) or on the route, whose route hands
 * the event to a Lambda handler of its own (`withIdempotency`, Middy), as an app moving onto the router does.
 */
export function routedTo(inner: Invoke, where: 'app' | 'route', options: Options): Invoke {
  const app = new Router();
  // Every result here has a statusCode and a body, which the router needs to take it as a proxy result.
  const route = async ({ event, context }: { event: unknown; context: Context }) =>
    (await inner(event as Event, context)) as Result & { statusCode: number; body: string };
  if (where === 'app') {
    app.use(routerIdempotency(opts(options)));
    app.post('/charges', route);
  } else app.post('/charges', [routerIdempotency(opts(options))], route);
  return (event, context) => app.resolve(event, context) as Promise<Result>;
}

export interface Combo {
  /** The handler covered twice, `outer` taking the event first. */
  nested(seen: Seen, outer: Options, inner: Options): Invoke;
  /** The handler under the outer registration alone. */
  single(seen: Seen, outer: Options): Invoke;
}

export const keyedEvent = (key: string) =>
  v2Event({ headers: { 'idempotency-key': key }, body: '{"amount":5}' });

/** The same options (the inner one adds `required`, which never conflicts, and leaves `scope` to the outer one). */
export async function agreeing(combo: Combo, store: IdempotencyStore = new MemoryStore()) {
  const seen: Seen = { runs: 0, keys: [] };
  const handler = combo.nested(seen, { store, scope: () => 'outer' }, { store, required: true });
  const first = keyedEvent('k1');
  const answers = [
    await handler(first, lambdaContext()),
    // The same event object invoked again is a retry, not a nested registration.
    await handler(first, lambdaContext()),
    await handler(keyedEvent('k1'), lambdaContext()),
  ];
  // What the outer registration alone gives the handler, and what an unscoped one would.
  const alone = async (options: Options) => {
    const other: Seen = { runs: 0, keys: [] };
    await combo.single(other, { store: new MemoryStore(), ...options })(keyedEvent('k1'), lambdaContext());
    return other.keys[0]?.[1];
  };
  const outerKey = await alone({ scope: () => 'outer' });
  const unscopedKey = await alone({ scope: false });
  return { answers, runs: seen.runs, keys: seen.keys, outerKey, unscopedKey };
}
export type Agreeing = Awaited<ReturnType<typeof agreeing>>;

/** The inner one sets `differing` otherwise; then a retry through the outer registration alone. */
export async function refused(combo: Combo, differing: Options, store: IdempotencyStore = new MemoryStore()) {
  const seen: Seen = { runs: 0, keys: [] };
  const errors: string[] = [];
  const noop = () => {};
  const logger: Logger = { debug: noop, info: noop, warn: noop, error: (_o, msg) => errors.push(msg ?? '') };
  const outer: Options = { store, scope: false };
  const invoke = combo.nested(seen, outer, { store, scope: false, ...differing, logger });
  const answer = await invoke(keyedEvent('k2'), lambdaContext());
  const runsRefused = seen.runs;
  const retried = await combo.single(seen, outer)(keyedEvent('k2'), lambdaContext());
  return { answer, runsRefused, errors, retried, runs: seen.runs };
}
export type Refused = Awaited<ReturnType<typeof refused>>;

/** One run under the outer registration's key, its answer replayed; `current`: currentIdempotency() reaches it. */
export function expectAgreeing(got: Agreeing, current: boolean): void {
  const [first, again, retry] = got.answers;
  expect(first).toMatchObject({ statusCode: 201, body: 'run 1' });
  for (const replay of [again, retry])
    expect(replay).toMatchObject({
      statusCode: 201,
      body: 'run 1',
      headers: { 'idempotent-replayed': 'true', 'x-run': '1' },
    });
  expect(got.runs).toBe(1);
  expect(got.outerKey).not.toBe(got.unscopedKey);
  expect(got.keys).toEqual([[current ? got.outerKey : null, got.outerKey]]);
}

/** A 500 conflicting-registrations naming `option`, the handler not run, the key released for a retry. */
export function expectRefused(got: Refused, option: string): void {
  expect(got.answer.statusCode).toBe(500);
  expect(got.answer.headers?.['content-type']).toMatch(/^application\/problem\+json/);
  expect(JSON.parse(got.answer.body as string)).toMatchObject({
    type: 'https://oncely.dev/problems/conflicting-registrations',
    status: 500,
  });
  expect(got.runsRefused).toBe(0);
  expect(got.errors).toHaveLength(1);
  expect(got.errors[0]).toContain(`set ${option} differently`);
  // Nothing was stored and the outer one's key was released: the retry runs.
  expect(got.retried.statusCode).toBe(201);
  expect(got.retried.headers?.['idempotent-replayed']).toBeUndefined();
  expect(got.runs).toBe(1);
}

/** The deciding options the refusal cases set otherwise nearer the handler. */
export const DIFFERING: ReadonlyArray<[string, Options]> = [
  ['ttl', { ttl: '1h' }],
  ['scope', { scope: () => 'inner' }],
];
