#!/usr/bin/env node
// Prints, one a line, the test files under the given directories that need no service but Redis: those whose
// opening docblock names nothing in `@services` besides redis and chromium (a local browser binary, not a server).
// CI runs these on every supported Node besides the primary one, where only Redis is up.
//
//   npx jest --runTestsByPath $(node scripts/redis-only-tests.mjs packages/core packages/express)
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { services, servicesOf } = require('../packages/testing/jest/services.cjs');

const ALLOWED = new Set(['redis', 'chromium']);
const dirs = process.argv.slice(2);
if (dirs.length === 0) {
  console.error('usage: node scripts/redis-only-tests.mjs <dir>...');
  process.exit(1);
}

/** The *.test.ts files under a package's test/ directory (as jest's testMatch finds them). */
function testFiles(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return entry.name === 'node_modules' ? [] : testFiles(path);
    return entry.name.endsWith('.test.ts') ? [path] : [];
  });
}

const known = services();
for (const dir of dirs) {
  const files = testFiles(join(dir, 'test')).sort();
  if (files.length === 0) {
    console.error(`redis-only-tests: no test files under ${dir}`);
    process.exit(1);
  }
  for (const file of files) {
    if (servicesOf(file, known).every((name) => ALLOWED.has(name))) console.log(file);
  }
}
