import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { repositoryRoot } from '../src';

// README.md's commands on a machine with only Node and npm: the root scripts they name exist, and
// scripts/pnpm.mjs (what `npm run setup` and the pnpm-based scripts run) picks the pinned pnpm whatever is installed.
const root = repositoryRoot();
const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  packageManager: string;
  scripts: Record<string, string>;
};
const pinned = manifest.packageManager.replace(/^pnpm@/, '');

test('every `npm run X` and `npm start`/`npm test` in README.md is a root script', () => {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const named = new Set([...readme.matchAll(/\bnpm run ([\w:-]+)/g)].map((match) => match[1] as string));
  if (/\bnpm start\b/.test(readme)) named.add('start');
  if (/\bnpm test\b/.test(readme)) named.add('test');
  expect(named.size).toBeGreaterThan(8);
  expect([...named].filter((name) => !(name in manifest.scripts))).toEqual([]);
});

test('package.json pins one exact pnpm version, and nothing else names it', () => {
  expect(manifest.packageManager).toMatch(/^pnpm@\d+\.\d+\.\d+$/);
  for (const file of ['README.md', '.ci/run', '.github/workflows/ci.yml', 'scripts/pnpm.mjs']) {
    expect({ file, names: readFileSync(join(root, file), 'utf8').includes(pinned) }).toEqual({
      file,
      names: false,
    });
  }
});

describe('scripts/pnpm.mjs', () => {
  let bin: string;
  beforeAll(() => {
    bin = mkdtempSync(join(tmpdir(), 'oncely-pnpm-'));
    // A pnpm that reports FAKE_PNPM_VERSION and otherwise prints its arguments and exits with FAKE_PNPM_EXIT.
    writeFileSync(
      join(bin, 'pnpm'),
      '#!/bin/sh\nif [ "$1" = --version ]; then echo "$FAKE_PNPM_VERSION"; exit 0; fi\necho "fake pnpm $*"\nexit "$FAKE_PNPM_EXIT"\n',
    );
    chmodSync(join(bin, 'pnpm'), 0o755);
    writeFileSync(join(bin, 'pnpm.cjs'), 'console.log("running pnpm " + process.argv.slice(2).join(" "));\n');
  });
  afterAll(() => rmSync(bin, { recursive: true, force: true }));

  const run = (args: string[], env: Record<string, string>) => {
    const { npm_config_user_agent: _agent, npm_execpath: _execpath, ...rest } = process.env;
    const result = spawnSync(process.execPath, [join(root, 'scripts/pnpm.mjs'), ...args], {
      cwd: root,
      env: { ...rest, PATH: `${bin}${delimiter}${process.env.PATH}`, FAKE_PNPM_EXIT: '0', ...env },
      encoding: 'utf8',
      timeout: 120_000,
    });
    return { status: result.status, output: `${result.stdout}${result.stderr}` };
  };

  test('uses a pnpm on PATH of the pinned version, with the arguments and exit code as given', () => {
    expect(run(['install', '--frozen-lockfile'], { FAKE_PNPM_VERSION: pinned })).toEqual({
      status: 0,
      output: 'fake pnpm install --frozen-lockfile\n',
    });
    expect(run(['test'], { FAKE_PNPM_VERSION: pinned, FAKE_PNPM_EXIT: '3' }).status).toBe(3);
  });

  test('reuses the pnpm running it (a `pnpm run` of the pinned version) without looking at PATH', () => {
    const result = run(['-r', 'build'], {
      FAKE_PNPM_VERSION: '0.0.0',
      npm_config_user_agent: `pnpm/${pinned} npm/? node/${process.version} linux x64`,
      npm_execpath: join(bin, 'pnpm.cjs'),
    });
    expect(result).toEqual({ status: 0, output: 'running pnpm -r build\n' });
  });

  test('runs the pinned version through npm when the pnpm on PATH is another one', () => {
    const result = run(['--version'], { FAKE_PNPM_VERSION: '9.15.0' });
    expect(result.status).toBe(0);
    expect(result.output).toContain(`running pnpm ${pinned} (package.json packageManager) through npm exec`);
    expect(result.output.split('\n')).toContain(pinned);
    expect(result.output).not.toContain('fake pnpm');
  });
});
