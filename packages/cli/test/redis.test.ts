/**
 * @services redis
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { RedisStore } from '@oncely/redis';
import { freePort } from '@oncely/testing';
import Redis from 'ioredis';
import { oncely, silentServer } from './fixture';
import { cliSuite } from './suite';

const URL = 'redis://127.0.0.1:6379';
const prefix = `oncely-cli-${randomBytes(4).toString('hex')}:`;
let client: Redis;

beforeAll(() => {
  client = new Redis(URL, { maxRetriesPerRequest: 1 });
});
afterAll(async () => {
  // Only this file's keys: the shared server is never flushed.
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  client.disconnect();
});

cliSuite('oncely on Redis', {
  store: () => new RedisStore({ client, prefix }),
  connection: () => ['--url', URL, '--prefix', prefix],
  writeForeign: async (storeKey) => {
    await client.set(prefix + storeKey, 'not a record');
  },
});

test('the real bin: inspect a record from $REDIS_URL, exit code and output', async () => {
  const store = new RedisStore({ client, prefix });
  await store.acquire('bin-key', { fingerprint: 'fp-of-bin', lockTimeoutMs: 60_000 });
  const bin = join(__dirname, '..', 'src', 'bin.ts');
  const run = promisify(execFile);
  const { stdout } = await run(
    process.execPath,
    [
      '--conditions=@oncely/source',
      '--import',
      'tsx',
      bin,
      'inspect',
      'bin-key',
      '--prefix',
      prefix,
      '--json',
    ],
    { env: { ...process.env, REDIS_URL: URL, ONCELY_URL: '' } },
  );
  expect(JSON.parse(stdout)).toMatchObject({
    key: 'bin-key',
    state: 'in_progress',
    fingerprint: 'fp-of-bin',
  });
  const missing = await run(
    process.execPath,
    ['--conditions=@oncely/source', '--import', 'tsx', bin, 'inspect', 'no-such-key', '--prefix', prefix],
    { env: { ...process.env, REDIS_URL: URL } },
  ).catch((error: { code: number; stderr: string }) => error);
  expect(missing).toMatchObject({ code: 1 });
  expect((missing as { stderr: string }).stderr).toContain('no record for key "no-such-key"');
});

test('delete on a terminal shows the record, asks, and deletes only on yes', async () => {
  const store = new RedisStore({ client, prefix });
  await store.acquire('stuck', { fingerprint: 'fp-stuck', lockTimeoutMs: 60_000 });
  const args = ['delete', 'stuck', '--url', URL, '--prefix', prefix];
  const declined = await oncely(args, {}, { typed: 'n\n' });
  expect(declined.code).toBe(6);
  expect(declined.stdout).toMatch(/^state\s+in progress/m);
  expect(declined.stderr).toContain('Delete this record? [y/N]');
  expect((await store.get('stuck'))?.state).toBe('in_progress');
  const accepted = await oncely(args, {}, { typed: 'y\n' });
  expect(accepted.code).toBe(0);
  expect(accepted.stdout).toContain('deleted');
  expect(await store.get('stuck')).toBeUndefined();
  // Unstuck: the key can be taken again at once.
  expect((await store.acquire('stuck', { fingerprint: 'other', lockTimeoutMs: 1000 })).status).toBe(
    'acquired',
  );
});

test('stats on a terminal shows its progress on stderr, and only the counts on stdout', async () => {
  const result = await oncely(['stats', '--url', URL, '--prefix', prefix], {}, { typed: '' });
  expect(result.code).toBe(0);
  expect(result.stderr).toMatch(/scanned \d+ keys/);
  expect(result.stdout).not.toContain('scanned');
});

describe('failures of the command itself', () => {
  test('a server that does not answer: exit 3 within the timeout, with the address', async () => {
    const port = await freePort();
    const result = await oncely(['stats', '--url', `redis://127.0.0.1:${port}`, '--timeout', '1000']);
    expect(result.code).toBe(3);
    expect(result.stderr).toContain(`cannot reach redis 127.0.0.1:${port}`);
  });

  test('a server that accepts connections but never answers: exit 3 once the timeout is over, no hang', async () => {
    const silent = await silentServer();
    try {
      const started = performance.now();
      const result = await oncely([
        'inspect',
        'k',
        '--url',
        `redis://127.0.0.1:${silent.port}`,
        '--timeout',
        '500',
      ]);
      expect(result.code).toBe(3);
      expect(result.stderr).toContain(`cannot reach redis 127.0.0.1:${silent.port}`);
      // Generous: the bound is the timeout, not the test's own 30 s.
      expect(performance.now() - started).toBeLessThan(10_000);
    } finally {
      silent.close();
    }
  });

  test('usage errors exit 2: no store, an unknown command, option or scheme, a bad limit', async () => {
    expect((await oncely(['stats'])).code).toBe(2);
    expect((await oncely(['frobnicate', '--url', URL])).code).toBe(2);
    expect((await oncely(['stats', '--bogus', '--url', URL])).code).toBe(2);
    expect((await oncely(['stats', '--url', 'ftp://x'])).stderr).toContain('unknown store URL scheme');
    expect((await oncely(['list', '--limit', '0', '--url', URL])).code).toBe(2);
    expect((await oncely(['inspect', '--url', URL])).code).toBe(2);
    expect((await oncely(['stats', '--scope', 's', '--url', URL])).code).toBe(2);
    expect((await oncely(['inspect', 'k', '--yes', '--url', URL])).code).toBe(2);
    const help = await oncely(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Exit codes');
  });

  test('a password in the URL is never printed', async () => {
    const port = await freePort();
    const result = await oncely([
      'stats',
      '--url',
      `redis://user:s3cret@127.0.0.1:${port}`,
      '--timeout',
      '500',
    ]);
    expect(result.code).toBe(3);
    expect(result.stderr).not.toContain('s3cret');
  });
});
