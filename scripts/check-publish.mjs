#!/usr/bin/env node
// Dry-runs the publish of every publishable package, as the release does it: `pnpm publish --dry-run` (pnpm turns
// the workspace ranges into versions, then npm checks and packs each package) with public access, as
// .changeset/config.json sets it for `changeset publish`. `--force` dry-runs a version already on the registry too
// (pnpm skips those otherwise, after asking the registry for each). Fails when pnpm fails or a package is missing
// from the dry run. Needs no login: npm only warns about it in a dry run.
// Usage: node scripts/check-publish.mjs   (npm run check:publish)
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const started = performance.now();
const { ignore, access } = JSON.parse(readFileSync(join(root, '.changeset', 'config.json'), 'utf8'));
const packages = readdirSync(join(root, 'packages'))
  .map((dir) => join(root, 'packages', dir, 'package.json'))
  .filter((file) => existsSync(file))
  .map((file) => JSON.parse(readFileSync(file, 'utf8')))
  .filter((json) => json.private !== true && !ignore.includes(json.name));

const run = spawnSync(
  process.execPath,
  [
    join(root, 'scripts', 'pnpm.mjs'),
    '--recursive',
    ...packages.flatMap(({ name }) => ['--filter', name]),
    'publish',
    '--dry-run',
    '--no-git-checks',
    '--force',
    '--access',
    access,
  ],
  { cwd: root, encoding: 'utf8' },
);
const output = `${run.stdout}${run.stderr}`;
const problems = [];
if (run.status !== 0) problems.push(`pnpm publish --dry-run exited with ${run.status ?? run.signal}`);
for (const { name, version } of packages) {
  if (!output.includes(`+ ${name}@${version}`))
    problems.push(`${name}@${version} was not published in the dry run`);
}
if (problems.length > 0) {
  process.stderr.write(output);
  for (const problem of problems) console.error(`check-publish: ${problem}`);
  process.exit(1);
}
const seconds = ((performance.now() - started) / 1000).toFixed(1);
console.log(`check-publish: ok: ${packages.length} packages publish (dry run) (${seconds} s)`);
