import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { IdempotencyStore } from '@oncely/core';
import { freePort } from '@oncely/testing';
import type { ListPage, RecordView, Stats } from '../src';
import { oncely, silentServer } from './fixture';

export interface SqlSuiteOptions {
  /** The store's URL scheme and server, without a database path: `postgres://postgres@127.0.0.1:5432`. */
  server: string;
  /** The server's URL with the test database. */
  url: string;
  /** A store of its own on a fresh table named `name` (migrated), and the `--table` that names that table. */
  table(name: string): Promise<{ store: IdempotencyStore; option: string }>;
  /** Creates a table `name` that is not an oncely records table, and returns its `--table`. */
  foreignTable(name: string): Promise<string>;
  /** The `--table` of a table that does not exist. */
  missingTable(): string;
}

const run = promisify(execFile);

/** The built bin (`npm run build`), or its source through tsx when the package was not built. */
function binCommand(): string[] {
  const built = join(__dirname, '..', 'dist', 'bin.js');
  if (existsSync(built)) return [built];
  return ['--conditions=@oncely/source', '--import', 'tsx', join(__dirname, '..', 'src', 'bin.ts')];
}

/** What only a SQL store's backend does: keyset pages, its table option and its errors, the bin on a URL. */
export function sqlSuite(name: string, options: SqlSuiteOptions): void {
  /** Every page of `list --scope`, cursor after cursor: the keys seen and each page's length. */
  async function listAll(table: string, scope: string, limit: number) {
    const seen: string[] = [];
    const pages: number[] = [];
    let cursor: string | undefined;
    do {
      const args = [
        'list',
        '--url',
        options.url,
        '--table',
        table,
        '--scope',
        scope,
        '--limit',
        String(limit),
      ];
      const result = await oncely([...args, '--json', ...(cursor === undefined ? [] : ['--cursor', cursor])]);
      expect(result.code).toBe(0);
      const page = result.json<ListPage>();
      pages.push(page.records.length);
      seen.push(...page.records.map((record) => record.key));
      cursor = page.cursor;
    } while (cursor !== undefined && pages.length < 20);
    return { seen, pages };
  }

  describe(name, () => {
    test('list pages 23 records (4 pages of 7) in key order, each exactly once, and stats counts them', async () => {
      const { store, option } = await options.table('paging');
      const keys = Array.from({ length: 23 }, (_, i) => `page-key-${String(i).padStart(2, '0')}`);
      for (const [i, key] of keys.entries()) {
        const acquired = await store.acquire(`paging ${key}`, {
          fingerprint: `fp-${i}`,
          lockTimeoutMs: 60_000,
        });
        if (acquired.status !== 'acquired') throw new Error(`${key}: ${acquired.status}`);
        // Every third is left in progress; the others complete with a body of their own.
        if (i % 3 !== 0) {
          const body = Buffer.from(JSON.stringify({ n: i, pad: 'x'.repeat(2000) }));
          await store.complete(`paging ${key}`, acquired.token, { status: 200, headers: {}, body }, 60_000);
        }
      }
      const { seen, pages } = await listAll(option, 'paging', 7);
      expect(pages.length).toBeGreaterThanOrEqual(3);
      expect(pages.slice(0, 3)).toEqual([7, 7, 7]);
      expect(seen).toEqual(keys);

      const held = await oncely(['list', '--url', options.url, '--table', option, '--in-progress', '--json']);
      expect(held.json<ListPage>().records.map((record) => record.key)).toEqual(
        keys.filter((_, i) => i % 3 === 0),
      );

      const stats = (
        await oncely(['stats', '--url', options.url, '--table', option, '--json'])
      ).json<Stats>();
      expect(stats.byState).toEqual({ in_progress: 8, completed: 15, released: 0 });
      expect(stats.records).toBe(23);
      expect(stats.bytes).toBeGreaterThan(0);

      const one = await oncely([
        'inspect',
        'page-key-01',
        '--scope',
        'paging',
        '--url',
        options.url,
        '--table',
        option,
        '--json',
      ]);
      const record = one.json<RecordView>();
      expect(record).toMatchObject({ state: 'completed', fingerprint: 'fp-1', response: { status: 200 } });
      // The body is read up to the preview: its start, and its whole size.
      expect(record.response?.bodyPreview).toMatch(/^\{"n":1,"pad":"x+$/);
      expect(record.response?.bodyPreview.length).toBeLessThan(2000);
      expect(record.response?.bodyBytes).toBe(JSON.stringify({ n: 1, pad: 'x'.repeat(2000) }).length);
    });

    test('a rare scope among many records: short pages with a cursor, each record once', async () => {
      const { store, option } = await options.table('sparse');
      const acquire = (key: string) => store.acquire(key, { fingerprint: 'f', lockTimeoutMs: 60_000 });
      // More records of another scope than one page's window walks, sorting before the rare scope's.
      for (let i = 0; i < 1200; i += 100) {
        await Promise.all(
          Array.from({ length: 100 }, (_, j) => acquire(`other k${String(i + j).padStart(4, '0')}`)),
        );
      }
      for (const key of ['r1', 'r2', 'r3']) await acquire(`rare ${key}`);
      const { seen, pages } = await listAll(option, 'rare', 2);
      expect(seen).toEqual(['r1', 'r2', 'r3']);
      // The pages that walked the other scope's records came back empty, with a cursor to go on.
      expect(pages[0]).toBe(0);
      expect(pages.slice(-2)).toEqual([2, 1]);
      const stats = (
        await oncely(['stats', '--url', options.url, '--table', option, '--json'])
      ).json<Stats>();
      expect(stats.byState.in_progress).toBe(1203);
    });

    test('a cursor the store did not print is a usage error', async () => {
      const { option } = await options.table('cursor');
      const result = await oncely([
        'list',
        '--url',
        options.url,
        '--table',
        option,
        '--cursor',
        'not a cursor!',
      ]);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain('--cursor');
    });

    test('a table that does not exist: exit 4, naming the table and --table', async () => {
      const result = await oncely(['stats', '--url', options.url, '--table', options.missingTable()]);
      expect(result.code).toBe(4);
      expect(result.stderr).toContain(options.missingTable().split('.').pop());
      expect(result.stderr).toContain('no table');
      expect(result.stderr).toContain('--table');
    });

    test('a table of another layout: exit 4 for every command', async () => {
      const option = await options.foreignTable('foreign');
      for (const command of [['stats'], ['list'], ['inspect', 'k']]) {
        const result = await oncely([...command, '--url', options.url, '--table', option]);
        expect(result.code).toBe(4);
        expect(result.stderr).toContain('not an oncely records table');
      }
    });

    test('a closed port: exit 3 at once, with the address and no password', async () => {
      const port = await freePort();
      const url = options.server.replace(/:\d+$/, `:${port}`).replace('//', '//user:s3cret@');
      const result = await oncely(['stats', '--url', `${url}/test`, '--timeout', '2000']);
      expect(result.code).toBe(3);
      expect(result.stderr).toContain(`127.0.0.1:${port}`);
      expect(result.stderr).not.toContain('s3cret');
    });

    test('a server that accepts and never answers: exit 3 within the timeout', async () => {
      const silent = await silentServer();
      try {
        const url = options.server.replace(/:\d+$/, `:${silent.port}`);
        const result = await oncely(['list', '--url', `${url}/test`, '--timeout', '500']);
        expect(result.code).toBe(3);
        expect(result.stderr).toContain(`cannot reach`);
        expect(result.stderr).toContain(`127.0.0.1:${silent.port}`);
      } finally {
        silent.close();
      }
    });

    test('the bin: stats and inspect on $DATABASE_URL, JSON out, exit codes', async () => {
      const { store, option } = await options.table('bin');
      const acquired = await store.acquire('bin-key', { fingerprint: 'fp-of-bin', lockTimeoutMs: 60_000 });
      expect(acquired.status).toBe('acquired');
      const env = { ...process.env, DATABASE_URL: options.url, ONCELY_URL: '', REDIS_URL: '' };
      const bin = binCommand();
      const { stdout } = await run(
        process.execPath,
        [...bin, 'inspect', 'bin-key', '--table', option, '--json'],
        {
          env,
        },
      );
      expect(JSON.parse(stdout)).toMatchObject({
        key: 'bin-key',
        state: 'in_progress',
        fingerprint: 'fp-of-bin',
      });
      const stats = await run(process.execPath, [...bin, 'stats', '--table', option, '--json'], { env });
      expect(JSON.parse(stats.stdout)).toMatchObject({ byState: { in_progress: 1 }, records: 1 });
      const missing = await run(process.execPath, [...bin, 'inspect', 'nope', '--table', option], {
        env,
      }).catch((error: { code: number; stderr: string }) => error);
      expect(missing).toMatchObject({ code: 1 });
    });
  });
}
