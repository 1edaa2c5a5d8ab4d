#!/usr/bin/env node
// Checks what users install: packs every publishable package (as `pnpm publish` would: workspace ranges become
// versions), installs all the tarballs together into an empty project, and loads every entry of each package's
// `exports` with `import()` from an .mjs file and `require()` from a .cjs file, failing when one throws or has no
// exports. Runs on the `node` that runs it (child processes use the same binary), so CI runs it once per Node
// version. Run `npm run build` first.
//
// The peer dependencies an import needs (the non-optional ones) are linked from the workspace's node_modules
// instead of being downloaded: only the tarballs' own dependencies come from the registry (`--prefer-offline`).
// An entry that needs an optional peer to load fails here, as it would for a user without that peer.
// Usage: node scripts/check-tarballs.mjs [--keep]   (--keep leaves the project in the temp directory)
import { execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const keep = process.argv.includes('--keep');
const started = performance.now();
const seconds = () => `${((performance.now() - started) / 1000).toFixed(1)} s`;

const { ignore } = JSON.parse(readFileSync(join(root, '.changeset', 'config.json'), 'utf8'));
const packages = readdirSync(join(root, 'packages'))
  .map((dir) => ({
    dir: join(root, 'packages', dir),
    json: readJson(join(root, 'packages', dir, 'package.json')),
  }))
  .filter(({ json }) => json !== undefined && json.private !== true && !ignore.includes(json.name));

function readJson(file) {
  return existsSync(file) ? JSON.parse(readFileSync(file, 'utf8')) : undefined;
}

const unbuilt = packages.filter(({ dir }) => !existsSync(join(dir, 'dist')));
if (unbuilt.length > 0) {
  console.error(
    `check-tarballs: no dist/ in ${unbuilt.map(({ json }) => json.name).join(', ')}: run npm run build`,
  );
  process.exit(1);
}

const project = mkdtempSync(join(tmpdir(), 'oncely-tarballs-'));
const tarballs = join(project, 'tarballs');
mkdirSync(tarballs);
let failed = false;
try {
  execFileSync(
    process.execPath,
    [
      join(root, 'scripts', 'pnpm.mjs'),
      ...packages.flatMap(({ json }) => ['--filter', json.name]),
      'pack',
      '--pack-destination',
      tarballs,
    ],
    { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] },
  );
  const files = readdirSync(tarballs).filter((file) => file.endsWith('.tgz'));
  if (files.length !== packages.length) {
    throw new Error(`packed ${files.length} tarballs for ${packages.length} packages: ${files.join(', ')}`);
  }
  console.log(`check-tarballs: packed ${files.length} packages (${seconds()})`);

  // Every tarball is a dependency of the project, so npm takes @oncely/* from them, never from the registry.
  const dependencies = Object.fromEntries(
    packages.map(({ json }) => {
      const file = files.find(
        (name) => name === `${json.name.slice(1).replace('/', '-')}-${json.version}.tgz`,
      );
      if (file === undefined)
        throw new Error(`no tarball for ${json.name}@${json.version} in ${files.join(', ')}`);
      return [json.name, `file:tarballs/${file}`];
    }),
  );
  writeFileSync(join(project, 'package.json'), JSON.stringify({ private: true, dependencies }, null, 2));
  execFileSync(
    'npm',
    [
      'install',
      '--prefer-offline',
      '--legacy-peer-deps',
      '--ignore-scripts',
      '--no-audit',
      '--no-fund',
      '--no-package-lock',
      '--loglevel=error',
    ],
    { cwd: project, stdio: ['ignore', 'ignore', 'inherit'] },
  );
  console.log(`check-tarballs: installed them into ${project} (${seconds()})`);

  linkPeers(project, false);

  const entries = packages.flatMap(({ json }) => {
    const packed = readJson(join(project, 'node_modules', json.name, 'package.json'));
    return Object.keys(packed.exports ?? { '.': packed.main })
      .filter((subpath) => subpath !== './package.json' && !subpath.includes('*'))
      .map((subpath) => ({ entry: json.name + subpath.slice(1), optional: optionalPeers(json) }));
  });
  writeFileSync(join(project, 'load.mjs'), loader('esm'));
  writeFileSync(join(project, 'load.cjs'), loader('cjs'));

  // First with the required peers only; an entry that fails only for want of one of its package's optional peers
  // (an ORM subpath needs its ORM) is loaded again once every peer is linked.
  const retry = new Set();
  for (const results of loadAll(entries.map(({ entry }) => entry))) {
    for (const { entry, format, error, names } of results) {
      const { optional } = entries.find((candidate) => candidate.entry === entry);
      const missing =
        error === undefined ? undefined : /Cannot find (?:package|module) '([^']+)'/.exec(error)?.[1];
      if (missing !== undefined && optional.includes(missing)) retry.add(entry);
      else failed = report(entry, format, error, names) || failed;
    }
  }
  if (retry.size > 0) {
    linkPeers(project, true);
    console.log(`check-tarballs: with their optional peers: ${[...retry].join(', ')}`);
    for (const results of loadAll([...retry])) {
      for (const { entry, format, error, names } of results)
        failed = report(entry, format, error, names) || failed;
    }
  }
  console.log(
    `check-tarballs: ${failed ? 'FAILED' : 'ok'}: ${entries.length} entries, import and require, on Node ${process.version} (${seconds()})`,
  );
} catch (error) {
  failed = true;
  console.error(`check-tarballs: ${error instanceof Error ? error.message : error}`);
} finally {
  if (keep) console.log(`check-tarballs: kept ${project}`);
  else rmSync(project, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;

function optionalPeers(json) {
  const meta = json.peerDependenciesMeta ?? {};
  return Object.keys(json.peerDependencies ?? {}).filter((peer) => meta[peer]?.optional === true);
}

// Loads the entries in a child process per format, each on this same Node binary.
function loadAll(list) {
  writeFileSync(join(project, 'entries.json'), JSON.stringify(list));
  return [
    ['import', 'load.mjs'],
    ['require', 'load.cjs'],
  ].map(([format, file]) =>
    JSON.parse(execFileSync(process.execPath, [file], { cwd: project, encoding: 'utf8' })).map((result) => ({
      ...result,
      format,
    })),
  );
}

function report(entry, format, error, names) {
  if (error !== undefined) console.error(`check-tarballs: ${entry} (${format}) fails to load: ${error}`);
  else if (names === 0) console.error(`check-tarballs: ${entry} (${format}) loads with no exports`);
  return error !== undefined || names === 0;
}

// Links the peer dependencies (the optional ones too, or not) that no tarball brought into the project, from the
// node_modules of the workspace package that declares them (pnpm links a package's peers there as devDependencies).
function linkPeers(project, withOptional) {
  for (const { dir, json } of packages) {
    const optional = optionalPeers(json);
    for (const peer of Object.keys(json.peerDependencies ?? {})) {
      if (!withOptional && optional.includes(peer)) continue;
      const target = join(project, 'node_modules', peer);
      if (existsSync(target)) continue;
      const source = join(dir, 'node_modules', peer);
      if (!existsSync(source))
        throw new Error(`${json.name}'s peer ${peer} is not installed in ${dir}/node_modules`);
      mkdirSync(dirname(target), { recursive: true });
      symlinkSync(realpathSync(source), target, 'dir');
    }
  }
}

// The child that loads every entry in one format and prints, for each, the number of its exports or the error.
function loader(format) {
  const load = format === 'esm' ? 'await import(entry)' : 'require(entry)';
  const head =
    format === 'esm'
      ? "import { readFileSync } from 'node:fs';\n"
      : "const { readFileSync } = require('node:fs');\n";
  const body = `
const results = [];
for (const entry of JSON.parse(readFileSync('entries.json', 'utf8'))) {
  try {
    const loaded = ${load};
    results.push({ entry, names: Object.keys(loaded).filter((name) => name !== 'default').length });
  } catch (error) {
    results.push({ entry, error: String(error && error.stack ? error.stack.split('\\n').slice(0, 3).join(' | ') : error) });
  }
}
process.stdout.write(JSON.stringify(results));
`;
  return format === 'esm' ? head + body : `${head}(async () => {${body}})();\n`;
}
