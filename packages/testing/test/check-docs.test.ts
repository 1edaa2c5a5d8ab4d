import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { repositoryRoot } from '../src';

// scripts/check-docs.mjs without its type-check (`--no-types`, which needs no build): what a user of an installed
// package follows back to the repository. Run on a small repository of mistakes, then on this one.
const root = repositoryRoot();
// Written so that this file does not trip the check itself.
const section = '\u00a7';
const site = ['https://oncely', 'dev'].join('.');
const run = (cwd: string) =>
  spawnSync(process.execPath, [join(cwd, 'scripts', 'check-docs.mjs'), '--no-types'], { encoding: 'utf8' });

describe('scripts/check-docs.mjs --no-types', () => {
  let fixture: string;
  const write = (path: string, text: string) => {
    mkdirSync(dirname(join(fixture, path)), { recursive: true });
    writeFileSync(join(fixture, path), text);
  };
  const repo = 'https://github.com/acme/widget';
  const fields = (name: string) => ({
    name: `@acme/${name}`,
    repository: { type: 'git', url: `git+${repo}.git`, directory: `packages/${name}` },
    homepage: `${repo}/tree/main/packages/${name}#readme`,
    bugs: { url: `${repo}/issues` },
  });

  beforeAll(() => {
    fixture = mkdtempSync(join(tmpdir(), 'oncely-check-docs-'));
    mkdirSync(join(fixture, 'scripts'));
    copyFileSync(join(root, 'scripts', 'check-docs.mjs'), join(fixture, 'scripts', 'check-docs.mjs'));
    mkdirSync(join(fixture, 'node_modules'));
    symlinkSync(join(root, 'node_modules', 'typescript'), join(fixture, 'node_modules', 'typescript'), 'dir');
    write(
      'package.json',
      JSON.stringify({ name: 'widget', repository: { type: 'git', url: `git+${repo}.git` } }),
    );
    write('README.md', '# Widget\n\n[Setup](docs/guide.md#setup), [gone](docs/guide.md#nope)\n');
    write(
      'docs/guide.md',
      `# Guide\n\n## Setup\n\nSee [missing](missing.md). Stores follow contract ${section}4; RFC 9110 ${section}9.2.2 is fine.\n`,
    );
    write('packages/good/package.json', JSON.stringify(fields('good')));
    write('packages/good/README.md', `# good\n\n[Setup](${repo}/blob/main/docs/guide.md#setup)\n`);
    write(
      'packages/bad/package.json',
      JSON.stringify({ ...fields('bad'), homepage: undefined, bugs: undefined }),
    );
    write('packages/bad/README.md', '# bad\n\n[Guide](../../docs/guide.md#setup), [dir](../good)\n');
    write(
      'packages/bad/src/index.ts',
      [
        `export const docs = '${site}/docs/security#scope';`,
        `export const problem = '${site}/problems/key-missing';`,
        `export const moved = '${repo}/blob/main/docs/guide.md#gone';`,
        '',
      ].join('\n'),
    );
  });
  afterAll(() => rmSync(fixture, { recursive: true, force: true }));

  test('names each mistake, where it is', () => {
    const result = run(fixture);
    expect(result.status).toBe(1);
    const lines = result.stderr.split('\n').filter((line) => line !== '' && !line.startsWith('check:docs:'));
    expect(lines.sort()).toEqual(
      [
        'README.md:3: docs/guide.md#nope: docs/guide.md has no heading for #nope',
        'docs/guide.md:5: missing.md: docs/missing.md does not exist',
        `docs/guide.md:5: '${section}' cites a section nobody can look up; state the rule itself (an RFC's is fine)`,
        `packages/bad/package.json: homepage is undefined, expected "${repo}/tree/main/packages/bad#readme"`,
        `packages/bad/package.json: bugs.url is undefined, expected "${repo}/issues"`,
        `packages/bad/README.md:3: ../../docs/guide.md#setup: npm shows this README without the repository: link ${repo}/blob/main/docs/guide.md#setup`,
        `packages/bad/README.md:3: ../good: npm shows this README without the repository: link ${repo}/tree/main/packages/good`,
        `packages/bad/src/index.ts:1: ${site}/docs/security#scope: oncely.dev has no such page; link the repository's docs`,
        `packages/bad/src/index.ts:3: ${repo}/blob/main/docs/guide.md#gone: docs/guide.md has no heading for #gone`,
      ].sort(),
    );
  });

  test('finds nothing to say in this repository', () => {
    const result = run(root);
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
  });
});
