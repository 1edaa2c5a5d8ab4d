/**
 * @services redis
 */
// One handler covered by two registrations (withIdempotency twice, the Powertools router's middleware twice, inside
// withIdempotency or around it): one of them handles each event. Middy's cases: http-nested-middy.test.ts.
import { withIdempotency } from '../src';
import {
  agreeing,
  type Combo,
  DIFFERING,
  eventHandler,
  expectAgreeing,
  expectRefused,
  type Invoke,
  opts,
  refused,
  routed,
  routedTo,
} from './http-nested-cases';
import { redisStores, type TestStores } from './http-stores';

const wrapped: Combo['single'] = (seen, options) =>
  withIdempotency(eventHandler(seen), opts(options)) as Invoke;

const COMBOS: ReadonlyArray<[string, Combo]> = [
  [
    'withIdempotency twice',
    {
      nested: (seen, outer, inner) =>
        withIdempotency(withIdempotency(eventHandler(seen), opts(inner)), opts(outer)) as Invoke,
      single: wrapped,
    },
  ],
  [
    'routerIdempotency twice (app.use and the route)',
    {
      nested: (seen, outer, inner) => routed(seen, outer, inner),
      single: (seen, outer) => routed(seen, outer, undefined),
    },
  ],
  ...(['app', 'route'] as const).map((where): [string, Combo] => [
    `withIdempotency inside routerIdempotency (${where === 'app' ? 'app.use' : 'the route'})`,
    {
      nested: (seen, outer, inner) =>
        routedTo(withIdempotency(eventHandler(seen), opts(inner)) as Invoke, where, outer),
      single: (seen, outer) => routedTo(eventHandler(seen), where, outer),
    },
  ]),
  [
    'routerIdempotency inside withIdempotency',
    {
      nested: (seen, outer, inner) => withIdempotency(routed(seen, inner, undefined), opts(outer)) as Invoke,
      single: wrapped,
    },
  ],
];

describe.each(COMBOS)('%s', (_name, combo) => {
  test('the same options: the handler runs once under the outer registration, its answer replayed', async () => {
    expectAgreeing(await agreeing(combo), true);
  });

  test.each(DIFFERING)(
    '%s set otherwise nearer the handler: 500 conflicting-registrations, the key released',
    async (option, differing) => {
      expectRefused(await refused(combo, differing), option);
    },
  );
});

describe('nested registrations on Redis', () => {
  let stores: TestStores;
  beforeAll(async () => {
    stores = await redisStores();
  });
  afterAll(() => stores.stop());

  test('withIdempotency twice: one run and a replay; a conflict releases the key', async () => {
    const combo = COMBOS[0]?.[1] as Combo;
    expectAgreeing(await agreeing(combo, await stores.make()), true);
    expectRefused(await refused(combo, { ttl: '1h' }, await stores.make()), 'ttl');
  });
});
