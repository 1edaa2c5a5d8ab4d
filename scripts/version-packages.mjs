#!/usr/bin/env node
// Turns the pending changesets into versions and CHANGELOG entries: `changeset version`, with two rules changesets
// has no setting for, applied only for the length of the run (.changeset/config.json and each package.json are
// given back as they were, with the new versions):
// - A package never released (version 0.0.0) is left out of the `linked` group, so its first version comes from
//   its own changesets (a `minor` one gives 0.1.0) instead of the group's highest version plus the bump (a new
//   package would start at 0.2.0 beside packages at 0.1.0).
// - A peer dependency on a workspace package counts as a dependency: the dependent is bumped with it (as far as the
//   group's bump, through `linked`) and republished with the new range. changesets bumps it to a major instead,
//   which `linked` then spreads to every package released with it.
// Fails when a package that was at 0.0.0 does not come out at 0.1.0, or a publishable package stays at 0.0.0.
// Usage: node scripts/version-packages.mjs   (npm run version-packages)
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const configPath = join(root, '.changeset', 'config.json');
const configText = readFileSync(configPath, 'utf8');
const config = JSON.parse(configText);

function readPackages() {
  return readdirSync(join(root, 'packages'), { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => {
      const file = join(root, 'packages', entry.name, 'package.json');
      const text = readFileSync(file, 'utf8');
      return { file, text, json: JSON.parse(text) };
    });
}

const publishable = ({ json }) => json.private !== true && !config.ignore.includes(json.name);
const packages = readPackages();
const before = new Map(packages.map(({ json }) => [json.name, json.version]));
const released = packages.filter(({ json }) => json.version !== '0.0.0').map(({ json }) => json.name);

// changesets reads `linked` entries as globs; listing the released packages by name keeps the new ones out.
const matches = (pattern, name) =>
  pattern.endsWith('*') ? name.startsWith(pattern.slice(0, -1)) : pattern === name;
const linked = config.linked
  .map((group) => released.filter((name) => group.some((pattern) => matches(pattern, name))))
  .filter((group) => group.length > 1);

function peersAsDependencies(json) {
  const peers = Object.entries(json.peerDependencies ?? {}).filter(([, range]) =>
    range.startsWith('workspace:'),
  );
  if (peers.length === 0) return undefined;
  const peerDependencies = { ...json.peerDependencies };
  for (const [name] of peers) delete peerDependencies[name];
  return { ...json, peerDependencies, dependencies: { ...Object.fromEntries(peers), ...json.dependencies } };
}

const changed = packages.flatMap((pkg) => {
  const shown = peersAsDependencies(pkg.json);
  return shown === undefined ? [] : [{ ...pkg, shown }];
});
try {
  writeFileSync(configPath, `${JSON.stringify({ ...config, linked }, null, 2)}\n`);
  for (const { file, shown } of changed) writeFileSync(file, `${JSON.stringify(shown, null, 2)}\n`);
  execFileSync('npx', ['changeset', 'version'], { cwd: root, stdio: 'inherit' });
} finally {
  writeFileSync(configPath, configText);
  for (const { file, text } of changed) {
    const { version } = JSON.parse(readFileSync(file, 'utf8'));
    writeFileSync(file, text.replace(/"version": "[^"]*"/, `"version": "${version}"`));
  }
}

const problems = [];
for (const { json } of readPackages().filter(publishable)) {
  const was = before.get(json.name);
  console.log(`${json.name}: ${was} -> ${json.version}`);
  if (json.version === '0.0.0') {
    problems.push(`${json.name} is still at 0.0.0: add a changeset for it (minor, for its first release)`);
  } else if (was === '0.0.0' && json.version !== '0.1.0') {
    problems.push(
      `${json.name} went from 0.0.0 to ${json.version}: a first release is 0.1.0, make its changesets minor`,
    );
  }
}
if (problems.length > 0) {
  for (const problem of problems) console.error(`version-packages: ${problem}`);
  process.exit(1);
}
