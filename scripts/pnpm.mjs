#!/usr/bin/env node
// Runs the pnpm that package.json's `packageManager` pins, with the arguments given, on a machine that has only
// Node and npm: `node scripts/pnpm.mjs install` is what `npm run setup` runs.
//
// Which pnpm, in order: the one already running this script (a `pnpm run` of that version); a `pnpm` on PATH of
// that version; otherwise npm fetches that exact version into its cache and runs it (`npm exec`). Not corepack:
// Node 25 no longer ships it, and it can refuse to fetch pnpm. Not a newer pnpm that "switches" to the pinned
// one either: pnpm 10 and 12 refuse or fail that switch where the registry's signatures do not verify.
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { packageManager } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const pinned = /^pnpm@(\d+\.\d+\.\d+)$/.exec(packageManager ?? '')?.[1];
if (pinned === undefined) {
  console.error(
    `scripts/pnpm.mjs: package.json's packageManager must read "pnpm@<x.y.z>"; it reads ${JSON.stringify(packageManager)}`,
  );
  process.exit(1);
}

const args = process.argv.slice(2);
const windows = process.platform === 'win32';

function pathPnpmVersion() {
  try {
    return execFileSync('pnpm', ['--version'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      shell: windows,
      timeout: 20_000,
    }).trim();
  } catch {
    return undefined;
  }
}

let command;
let commandArgs;
const running = /^pnpm\/(\S+)/.exec(process.env.npm_config_user_agent ?? '')?.[1];
if (running === pinned && process.env.npm_execpath) {
  // Started by `pnpm run` of the pinned version: run that same pnpm again, without a PATH lookup.
  command = process.execPath;
  commandArgs = [process.env.npm_execpath, ...args];
} else if (pathPnpmVersion() === pinned) {
  command = 'pnpm';
  commandArgs = args;
} else {
  console.error(`scripts/pnpm.mjs: running pnpm ${pinned} (package.json packageManager) through npm exec`);
  command = 'npm';
  // --yes: npm would otherwise ask before fetching it (or refuse, where the npm config says yes=false).
  commandArgs = ['exec', '--yes', `--package=pnpm@${pinned}`, '--', 'pnpm', ...args];
}

const child = spawn(command, commandArgs, { cwd: process.cwd(), stdio: 'inherit', shell: windows });
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal));
child.on('error', (error) => {
  console.error(`scripts/pnpm.mjs: could not run ${command}: ${error.message}`);
  process.exit(1);
});
child.on('exit', (code, signal) => {
  if (signal === null) process.exit(code ?? 1);
  // Die of the same signal, as a shell would report it (our forwarding handler must not catch it again).
  process.removeAllListeners(signal);
  process.kill(process.pid, signal);
});
