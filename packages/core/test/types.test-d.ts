// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles, so every mistake listed here must stay a compile error.
import {
  currentIdempotency,
  type Duration,
  type IdempotencyContext,
  type IdempotentOptions,
  idempotent,
  idempotentOutcome,
  type Jsonified,
  type JsonStorable,
  type JsonValue,
  MemoryStore,
  parseDuration,
} from '../src/index';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when `A` and `B` are the same type. */
const same = <A, B>(_proof: Equal<A, B>): void => undefined;

interface Order {
  id: string;
  placedAt: Date;
  total?: number;
  note: string | undefined;
  lines: { sku: string; shippedAt: Date | null }[];
  format(): string;
}
declare const order: Order;
const store = new MemoryStore();

export async function replayedResultsAreTypedAsJsonGivesThemBack(): Promise<void> {
  const charge = idempotent(async (o: Order) => o, { store, key: (o) => o.id });
  const result = await charge(order);
  same<typeof result, Jsonified<Order>>(true);
  same<
    Jsonified<Order>,
    {
      id: string;
      placedAt: string;
      lines: { sku: string; shippedAt: string | null }[];
      total?: number;
      note?: string;
    }
  >(true);
  // @ts-expect-error a Date comes back as its ISO string
  const placedAt: Date = result.placedAt;
  void placedAt;

  const outcome = await idempotentOutcome(async () => ({ at: new Date() }), { store, key: () => 'k' })();
  same<typeof outcome.result, { at: string }>(true);

  same<Jsonified<[Date, undefined, () => void]>, [string, null, null]>(true);
  same<Jsonified<Record<string, Date>>, { [key: string]: string }>(true);
  same<Jsonified<{ toJSON(): { v: number } }>, { v: number }>(true);
  same<Jsonified<string | null>, string | null>(true);
  same<Jsonified<unknown>, unknown>(true);
}

export function resultsJsonCannotCarryDoNotCompile(): void {
  // @ts-expect-error a BigInt has no JSON form
  idempotent(async () => ({ total: 10n }), { store, key: () => 'k' });
  // @ts-expect-error a BigInt has no JSON form, however deep
  idempotent(async () => ({ lines: [{ amount: 10n }] }), { store, key: () => 'k' });
  // @ts-expect-error undefined has no JSON form: return null for "no result"
  idempotent(async () => {}, { store, key: () => 'k' });
  // @ts-expect-error undefined has no JSON form, even as one case of a union
  idempotent(async (): Promise<Order | undefined> => undefined, { store, key: () => 'k' });
  // @ts-expect-error a Map has no JSON form
  idempotent(() => new Map<string, number>(), { store, key: () => 'k' });
  // @ts-expect-error a Set has no JSON form
  idempotent(async () => ({ tags: new Set(['a']) }), { store, key: () => 'k' });
  // @ts-expect-error a symbol has no JSON form
  idempotentOutcome(async () => ({ tag: Symbol('x') }), { store, key: () => 'k' });
  // @ts-expect-error a function has no JSON form
  idempotent(async () => () => 1, { store, key: () => 'k' });

  // What JSON carries compiles, class instances (their methods are not JSON's business) and unknown included.
  idempotent(async () => null, { store, key: () => 'k' });
  idempotent(async () => order, { store, key: () => 'k' });
  idempotent(async (): Promise<unknown> => 1, { store, key: () => 'k' });
}

/** A recursive JSON type, as many codebases declare one. */
type Json = string | number | boolean | null | Json[] | { [key: string]: Json };
/** The same with readonly arrays and properties that may be undefined. */
type ReadonlyJson =
  | string
  | number
  | boolean
  | null
  | readonly ReadonlyJson[]
  | { readonly [key: string]: ReadonlyJson | undefined };

export async function recursiveJsonTypesCompile(): Promise<void> {
  const json = await idempotent(async (): Promise<Json> => ({ a: [1, 'b'] }), { store, key: () => 'k' })();
  same<typeof json, Json>(true);
  const readonlyJson = await idempotent(async (): Promise<ReadonlyJson> => [1], { store, key: () => 'k' })();
  same<typeof readonlyJson, ReadonlyJson>(true);
  const mixed = await idempotentOutcome(
    async (): Promise<{ a: Date; b: Json }> => ({ a: new Date(), b: 1 }),
    {
      store,
      key: () => 'k',
    },
  )();
  same<typeof mixed.result, { a: string; b: Json }>(true);
  same<Jsonified<JsonValue>, JsonValue>(true);
  same<JsonStorable<Json>, Json>(true);
  // @ts-expect-error a BigInt beside a JSON value is still refused
  idempotent(async () => ({ total: 10n, raw: null as Json }), { store, key: () => 'k' });
}

export function jsonifiedFollowsWhatJsonStringifyWrites(): void {
  // An Error's message and stack, and a RegExp's lastIndex, are not enumerable: JSON writes `{}`.
  same<keyof Jsonified<Error>, never>(true);
  class CodedError extends Error {
    code = 'E_CODED';
  }
  same<Jsonified<CodedError>, { code: string }>(true);
  same<keyof Jsonified<{ pattern: RegExp }>['pattern'], never>(true);
  // A typed array is written as an object keyed by index: {"0":1,"1":2}.
  same<Jsonified<Uint8Array>, { [index: string]: number }>(true);
  same<Jsonified<Float64Array>, { [index: string]: number }>(true);
  // Node's Buffer has its own toJSON.
  same<Jsonified<Buffer>, { type: 'Buffer'; data: number[] }>(true);
  // `any` may hold anything, and stays a required property; `unknown` may be undefined, so it may be left out.
  // biome-ignore lint/suspicious/noExplicitAny: any is the case under test
  type Any = any;
  same<Jsonified<{ a: Any; u: unknown }>, { a: Any; u?: unknown }>(true);
  // JSON.parse gives mutable arrays.
  same<Jsonified<readonly Date[]>, string[]>(true);
  same<Jsonified<{ at: readonly Date[] }>, { at: string[] }>(true);
  same<Jsonified<readonly [Date, number]>, [string, number]>(true);
}

export async function optionsInAVariableAndGenericHelpersCompile(): Promise<void> {
  interface Message {
    id: string;
  }
  // Options in a variable typed IdempotentOptions may or may not hold a serializer: fn's type or its JSON form.
  const options: IdempotentOptions<[Message], { at: Date }> = { store, key: (m) => m.id };
  const handle = idempotent(async (_m: Message) => ({ at: new Date() }), options);
  same<Awaited<ReturnType<typeof handle>>, { at: Date } | { at: string }>(true);
  const handleOutcome = idempotentOutcome(async (_m: Message) => ({ at: new Date() }), options);
  same<Awaited<ReturnType<typeof handleOutcome>>['result'], { at: Date } | { at: string }>(true);

  // A generic helper states that its T must be storable, and passes T on.
  function once<T>(key: string, fn: () => Promise<T & JsonStorable<T>>): () => Promise<Jsonified<T>> {
    return idempotent<[], T>(fn, { store, key: () => key });
  }
  const placed = await once('k', async () => ({ at: new Date() }))();
  same<typeof placed, { at: string }>(true);
  // @ts-expect-error a BigInt has no JSON form, through the helper too
  once('k', async () => ({ total: 10n }));
}

export async function aSerializerTakesAnyResultAndGivesItsOwnType(): Promise<void> {
  const run = idempotent(async () => ({ total: 10n }), {
    store,
    key: () => 'k',
    serialize: {
      serialize: (r) => new TextEncoder().encode(r.total.toString()),
      deserialize: (b) => ({ total: BigInt(new TextDecoder().decode(b)) }),
    },
  });
  same<Awaited<ReturnType<typeof run>>, { total: bigint }>(true);
}

export function durationsAreNumbersOrNumbersWithAUnit(fromConfig: string): void {
  const ok: Duration[] = [250, '250ms', '30s', '5m', '24h', '7d', '1.5h', '2 m'];
  void ok;
  // @ts-expect-error not a unit parseDuration knows
  const day: Duration = '1 day';
  // @ts-expect-error a unit is required
  const bare: Duration = '30';
  void [day, bare];
  // @ts-expect-error a string from configuration is not known to be a duration...
  const options: Partial<IdempotentOptions<[], number>> = { ttl: fromConfig, inProgress: { wait: '10s' } };
  // ...parseDuration() checks it where it is read (and throws a TypeError naming it when it is none).
  const checked: Partial<IdempotentOptions<[], number>> = { ttl: parseDuration(fromConfig) };
  void [options, checked];
  // @ts-expect-error not a duration
  new MemoryStore({ sweepInterval: '1 second' });
}

export function optionsDeclaredBeforeUseKeepTheirDurationsWithAsConstOrSatisfies(): void {
  const fn = async (id: string) => ({ id });
  const widened = { store, ttl: '24h' };
  // @ts-expect-error the declaration widened '24h' to string
  idempotent(fn, { ...widened, key: (id) => id });
  const frozen = { store, ttl: '24h' } as const;
  idempotent(fn, { ...frozen, key: (id) => id });
  const checked = { store, ttl: '24h', lockTimeout: '30s' } satisfies Partial<
    IdempotentOptions<[string], unknown>
  >;
  idempotent(fn, { ...checked, key: (id) => id });
  // @ts-expect-error satisfies checks the names too
  const misspelt = { store, ttll: '24h' } satisfies Partial<IdempotentOptions<[string], unknown>>;
  void misspelt;
}

export function aDurationIsWhatParseDurationReads(): void {
  // The type takes what a template literal's number takes; parseDuration reads these the same way.
  const read: Duration[] = ['1e3ms', '.5h', '+5s', '5.s'];
  // The type cannot refuse a negative: parseDuration does, when the options are checked.
  const negative: Duration = '-5s';
  void [read, negative];
  // @ts-expect-error not finite
  const infinite: Duration = 'Infinityms';
  void infinite;
}

export async function aStepResolvesToWhatJsonGivesBackAndNothingForNothing(
  ctx: IdempotencyContext,
): Promise<void> {
  const send = async (): Promise<void> => undefined;
  const emailed = await ctx.step('email', async () => {
    await send();
  });
  same<typeof emailed, undefined>(true);
  const nothing = await ctx.step('sync', () => undefined);
  same<typeof nothing, undefined>(true);
  const charge = await ctx.step('charge', async () => ({ id: 'ch_1', at: new Date() }));
  same<typeof charge, { id: string; at: string }>(true);
  const maybe = await ctx.step('maybe', async () => (Math.random() > 0.5 ? String(1) : undefined));
  same<typeof maybe, string | undefined>(true);
  const count = await ctx.step('count', () => 3);
  same<typeof count, number>(true);
  const order = await ctx.step('order', async () => ({}) as Order);
  same<typeof order, Jsonified<Order>>(true);
  // @ts-expect-error a Map has no JSON form
  await ctx.step('map', async () => new Map<string, number>());
  // @ts-expect-error a BigInt has no JSON form
  await ctx.step('big', () => 1n);
  // @ts-expect-error a BigInt property neither
  await ctx.step('nested', async () => ({ amount: 1n }));
  // @ts-expect-error a symbol has no JSON form
  await ctx.step('symbol', () => Symbol('s'));
  const current = currentIdempotency();
  if (current !== undefined) {
    const id = await current.step('id', () => 'x');
    same<typeof id, string>(true);
    same<ReturnType<typeof current.keyFor>, string>(true);
  }
}
