import { randomBytes } from 'node:crypto';
import type { IdempotencyStore } from '@oncely/core';
import type { ListPage, RecordView, Stats } from '../src';
import { oncely, type Written, writeRecords } from './fixture';

export interface SuiteOptions {
  /** The store the app writes with, under the prefix `connection` names. */
  store(): IdempotencyStore;
  /** The command's options that reach that store, with the same prefix. */
  connection(): string[];
  env?(): Record<string, string>;
  /**
   * Writes a value under the prefix that is no record (`key`: the store key). None for a SQL table, where every row
   * has the table's columns: a table of another layout is refused as a whole.
   */
  writeForeign?(storeKey: string): Promise<void>;
}

/**
 * Each subcommand against records a real store wrote through the Express adapter: one completed, one in progress,
 * one released with a recorded step, all in one scope under a prefix of the test's own.
 */
export function cliSuite(name: string, options: SuiteOptions): void {
  describe(name, () => {
    let written: Written;
    let store: IdempotencyStore;
    const run = (...args: string[]) => oncely([...args, ...options.connection()], options.env?.() ?? {});

    beforeAll(async () => {
      store = options.store();
      written = await writeRecords(store, randomBytes(4).toString('hex'));
    });
    afterAll(async () => {
      await written?.finish();
    });

    test('inspect shows a completed record: status, headers, body, fingerprint', async () => {
      const result = await run('inspect', written.completed, '--scope', written.scope, '--json');
      expect(result.code).toBe(0);
      const record = result.json<RecordView>();
      expect(record).toMatchObject({ key: written.completed, scope: written.scope, state: 'completed' });
      expect(record.response?.status).toBe(201);
      expect(JSON.parse(record.response?.bodyPreview ?? '')).toEqual({ paid: true, amount: 42 });
      expect(record.response?.headers['content-type']).toMatch(/application\/json/);
      expect(record.fingerprint).toMatch(/.{20,}/);
      expect(new Date(record.expiresAt as unknown as string).getTime()).toBeGreaterThan(Date.now());

      const human = await run('inspect', written.completed, '--scope', written.scope);
      expect(human.code).toBe(0);
      expect(human.stdout).toMatch(/^state\s+completed$/m);
      expect(human.stdout).toMatch(/^response\s+201/m);
      expect(human.stdout).toContain('"paid":true');
    });

    test('inspect shows an in-progress record with its owner and the lease left', async () => {
      const result = await run('inspect', written.inProgress, '--scope', written.scope, '--json');
      expect(result.code).toBe(0);
      const record = result.json<RecordView>();
      expect(record.state).toBe('in_progress');
      expect(record.owner).toEqual(expect.any(String));
      expect(record.leaseLeftMs).toBeGreaterThan(0);
      expect(record.response).toBeUndefined();
    });

    test('inspect shows a released record with its recorded step', async () => {
      const result = await run('inspect', written.released, '--scope', written.scope, '--json');
      expect(result.code).toBe(0);
      const record = result.json<RecordView>();
      expect(record.state).toBe('released');
      expect(record.steps?.map((step) => step.name)).toEqual(['charge']);
      expect(record.steps?.[0]?.preview).toContain('7');
      const human = await run('inspect', written.released, '--scope', written.scope);
      expect(human.stdout).toMatch(/^ {2}charge\s/m);
    });

    test('inspect of a key without a record, or in another scope, exits 1', async () => {
      expect((await run('inspect', 'no-such-key', '--scope', written.scope)).code).toBe(1);
      const unscoped = await run('inspect', written.completed);
      expect(unscoped.code).toBe(1);
      expect(unscoped.stderr).toContain('no record');
    });

    test('list pages through the scope without losing or repeating a record', async () => {
      const seen: string[] = [];
      let cursor: string | undefined;
      let pages = 0;
      do {
        const result = await run(
          'list',
          '--scope',
          written.scope,
          '--limit',
          '2',
          '--json',
          ...(cursor === undefined ? [] : ['--cursor', cursor]),
        );
        expect(result.code).toBe(0);
        const page = result.json<ListPage>();
        expect(page.records.length).toBeLessThanOrEqual(2);
        seen.push(...page.records.map((r) => r.key));
        cursor = page.cursor;
        pages++;
      } while (cursor !== undefined && pages < 50);
      expect(seen.sort()).toEqual([written.completed, written.inProgress, written.released].sort());
    });

    test('list --in-progress shows only the held key', async () => {
      const result = await run('list', '--in-progress', '--scope', written.scope, '--json');
      expect(result.code).toBe(0);
      expect(result.json<ListPage>().records.map((r) => r.key)).toEqual([written.inProgress]);
      const human = await run('list', '--scope', written.scope);
      expect(human.stdout).toMatch(/^STATE\s+SCOPE\s+KEY/m);
      expect(human.stdout).toContain(written.completed);
    });

    test('stats counts each state and the bytes they take', async () => {
      const result = await run('stats', '--json');
      expect(result.code).toBe(0);
      const stats = result.json<Stats>();
      expect(stats.byState).toEqual({ in_progress: 1, completed: 1, released: 1 });
      expect(stats.records).toBe(3);
      expect(stats.bytes).toBeGreaterThan(100);
      expect((await run('stats')).stdout).toMatch(/^ {2}completed\s+1$/m);
    });

    test('delete refuses without --yes off a terminal, then deletes with it', async () => {
      const refused = await run('delete', written.completed, '--scope', written.scope);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain('--yes');
      expect((await run('inspect', written.completed, '--scope', written.scope)).code).toBe(0);

      const deleted = await run('delete', written.completed, '--scope', written.scope, '--yes', '--json');
      expect(deleted.code).toBe(0);
      expect(deleted.json()).toMatchObject({ deleted: true, record: { state: 'completed' } });
      expect((await run('inspect', written.completed, '--scope', written.scope)).code).toBe(1);
      expect((await run('delete', written.completed, '--scope', written.scope, '--yes')).code).toBe(1);
      // Unstuck: the same key runs again.
      expect((await store.get?.(`${written.scope} ${written.completed}`)) ?? undefined).toBeUndefined();
    });

    const { writeForeign } = options;
    if (writeForeign === undefined) return;
    test('a value under the prefix that is no record: inspect exits 4, list and stats set it apart', async () => {
      await writeForeign('foreign value');
      const inspected = await run('inspect', 'value', '--scope', 'foreign');
      expect(inspected.code).toBe(4);
      expect(inspected.stderr).toContain('not of a layout');
      const stats = (await run('stats', '--json')).json<Stats>();
      expect(stats.unknown).toBe(1);
      const listed = await run('list', '--limit', '100');
      expect(listed.code).toBe(0);
      expect(listed.stderr).toContain('not oncely records');
    });
  });
}
