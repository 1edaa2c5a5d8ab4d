import { randomUUID } from 'node:crypto';
import { MemoryStore, PROBLEM_TYPES } from '@oncely/core';
import request from 'supertest';
import {
  type AdapterHarness,
  recordingLogger,
  type TestApp,
  type TestAppOptions,
  type TestRequest,
} from './suite-types';

/** The user a test request is sent as (`x-user`), for a per-user scope. */
const byUser = (req: TestRequest): string => `user:${String(req.headers['x-user'])}`;

/**
 * Two registrations covering one request (an app-wide one and one nearer the route): the registration nearest the
 * route decides, or the request is refused; never the outer one's settings silently, and never one user's
 * response in another's answer.
 */
export function nestedRegistrationsSuite(harness: AdapterHarness): void {
  describe('nested registrations', () => {
    const apps: TestApp[] = [];
    const make = async (outer: TestAppOptions, inner: TestAppOptions) => {
      const app = await harness.nested.create(outer, inner);
      apps.push(app);
      return app;
    };
    afterEach(async () => {
      await Promise.all(apps.splice(0).map((app) => app.close()));
    });
    const newKey = () => `key-${randomUUID()}`;
    const charge = (app: TestApp, key: string, user: string) =>
      request(app.url).post('/charges').set('Idempotency-Key', key).set('x-user', user).send({ amount: 100 });

    test("an unscoped app-wide registration and a per-user one on the route: Alice and Bob never get each other's response", async () => {
      const logger = recordingLogger();
      const app = await make({ scope: false, logger }, { scope: byUser });
      const key = newKey();
      const alice = await charge(app, key, 'alice');
      const bob = await charge(app, key, 'bob');
      const aliceAgain = await charge(app, key, 'alice');
      // Whatever the rule: Bob's answer is not Alice's.
      expect(bob.headers['idempotent-replayed']).toBeUndefined();
      if (bob.status === 201) expect(bob.body.id).not.toBe(alice.body.id);
      if (harness.nested.rule === 'nearest') {
        // The route's scope decides: two users, two records.
        expect(alice.status).toBe(201);
        expect(bob.status).toBe(201);
        expect(bob.headers['idempotent-replayed']).toBeUndefined();
        expect(bob.body.id).not.toBe(alice.body.id);
        expect(aliceAgain.headers['idempotent-replayed']).toBe('true');
        expect(aliceAgain.body).toEqual(alice.body);
        expect(app.count('charges')).toBe(2);
      } else {
        // Refused: the handler never runs under settings it was not given, and nothing is stored for anyone.
        for (const answer of [alice, bob, aliceAgain]) {
          expect(answer.status).toBe(500);
          expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
          expect(answer.body.type).toBe(PROBLEM_TYPES.conflictingRegistrations);
          expect(answer.body.detail).toMatch(/scope/);
          expect(answer.headers['idempotent-replayed']).toBeUndefined();
        }
        expect(app.count('charges')).toBe(0);
        const logged = logger.lines.filter(
          (line) => line.level === 'error' && /registrations/.test(line.msg ?? ''),
        );
        expect(logged).toHaveLength(3);
        expect(logged[0]?.msg).toMatch(/scope/);
        // The app-wide registration's key was released, not left locked or stored: another route it covers
        // alone runs under the same key.
        const other = await request(app.url).post('/status/201').set('Idempotency-Key', key).send({});
        expect(other.status).toBe(201);
        expect(app.count('status')).toBe(1);
      }
    });

    test('many concurrent users on the per-user route with one key: each answer is its own', async () => {
      const app = await make({ scope: false }, { scope: byUser });
      const key = newKey();
      const users = Array.from({ length: 8 }, (_, i) => `user-${i}`);
      const answers = await Promise.all(users.map((user) => charge(app, key, user)));
      const ids = new Set<unknown>();
      for (const answer of answers) {
        expect(answer.headers['idempotent-replayed']).toBeUndefined();
        if (harness.nested.rule === 'nearest') {
          expect(answer.status).toBe(201);
          ids.add(answer.body.id);
        } else {
          // Refused, or a 409 from the app-wide registration while another user's request holds the key there.
          expect([500, 409]).toContain(answer.status);
          expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
        }
      }
      expect(ids.size).toBe(harness.nested.rule === 'nearest' ? users.length : 0);
      expect(app.count('charges')).toBe(harness.nested.rule === 'nearest' ? users.length : 0);
    });

    test.each([
      ['with the same store given to both', true],
      ['with the store given to the app-wide one only', false],
    ])(
      'app-wide plus required: true on the route (docs/getting-started.md) %s keeps working',
      async (_name, both) => {
        const store = harness.store?.() ?? new MemoryStore();
        const app = await make({ store }, both ? { store, required: true } : { required: true });
        const key = newKey();
        const first = await charge(app, key, 'alice');
        expect(first.status).toBe(201);
        const replay = await charge(app, key, 'alice');
        expect(replay.status).toBe(201);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.body).toEqual(first.body);
        // The route's required is enforced; the app-wide one still leaves other routes' keys optional.
        const missing = await request(app.url).post('/charges').send({ amount: 100 });
        expect(missing.status).toBe(400);
        expect(missing.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect((await request(app.url).post('/status/201').send({})).status).toBe(201);
        expect(app.count('charges')).toBe(1);
      },
    );
  });
}
