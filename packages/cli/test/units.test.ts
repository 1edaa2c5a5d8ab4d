import { CliError, EXIT, recordView, splitStoreKey, storeKeyOf } from '../src';
import { loadDriver } from '../src/errors';

test('a missing store client: exit 5, and the package to install', async () => {
  const missing = Object.assign(new Error("Cannot find package 'pg'"), { code: 'ERR_MODULE_NOT_FOUND' });
  const failure = await loadDriver('pg', () => Promise.reject(missing)).catch((error: unknown) => error);
  expect(failure).toBeInstanceOf(CliError);
  expect(failure).toMatchObject({ exitCode: EXIT.missingDriver });
  expect((failure as Error).message).toContain('npm install pg');
  // Any other failure of the import is not dressed up as a missing package.
  const broken = new Error('syntax error in the module');
  await expect(loadDriver('pg', () => Promise.reject(broken))).rejects.toBe(broken);
});

test('store keys: the last space splits scope and key, as the engine composes them', () => {
  expect(storeKeyOf('k1', undefined)).toBe('k1');
  expect(storeKeyOf('k1', 'tenant a')).toBe('tenant a k1');
  expect(splitStoreKey('tenant a k1')).toEqual({ scope: 'tenant a', key: 'k1' });
  expect(splitStoreKey('k1')).toEqual({ scope: undefined, key: 'k1' });
});

test('a binary body is previewed in base64, a text body as text, both cut at 512 bytes', () => {
  const record = (body: Uint8Array) =>
    recordView(
      'k',
      'loc',
      {
        state: 'completed',
        fingerprint: 'f',
        token: '',
        lockExpiresAt: 0,
        expiresAt: Date.now() + 1000,
        response: { status: 200, headers: { 'x-a': ['1', '2'] }, body },
      },
      Date.now(),
    );
  const binary = record(Buffer.from([0, 1, 2, 255, 254]));
  expect(binary.response).toMatchObject({ bodyEncoding: 'base64', bodyPreview: 'AAEC//4=', bodyBytes: 5 });
  const text = record(Buffer.from('é'.repeat(400)));
  expect(text.response?.bodyEncoding).toBe('utf8');
  // 256 two-byte characters fit in 512 bytes: the cut falls between characters, never inside one.
  expect(text.response?.bodyPreview).toBe('é'.repeat(256));
  expect(text.response?.headers).toEqual({ 'x-a': ['1', '2'] });
  expect(binary.owner).toBeUndefined();
});
