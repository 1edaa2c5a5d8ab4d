// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles, so every mistake listed here must stay a compile error.
import {
  type Duration,
  type IdempotentOptions,
  idempotent,
  idempotentOutcome,
  type Jsonified,
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
