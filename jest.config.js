// One jest run for every package: tests import sibling packages by name and are mapped to their
// TypeScript sources, so `npm test` needs no build first. A test file that needs a service names it in its opening
// docblock (`@services redis`); when one is down, its files are left out and the run says so in one line per
// service, then fails (packages/testing/jest/services.cjs).
const { availableParallelism } = require('node:os');

/** @type {import('jest').Config} */
module.exports = {
  testEnvironment: 'node',
  // The Prisma tests' clients are generated, not committed: written here once, before any test file imports them.
  globalSetup: '<rootDir>/packages/orm/test/prisma/generate.cjs',
  roots: ['<rootDir>/packages', '<rootDir>/examples'],
  testMatch: ['**/test/**/*.test.ts'],
  moduleNameMapper: {
    '^@oncely/([a-z-]+)$': '<rootDir>/packages/$1/src/index.ts',
    '^@oncely/([a-z-]+)/([a-z-]+)$': '<rootDir>/packages/$1/src/$2/index.ts',
  },
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.test.json' }],
    // cookie@2 (used by fastify.inject) ships ESM only, which jest cannot require on Node 20: transpile it.
    '/node_modules/cookie/.+\\.js$': ['ts-jest', { tsconfig: { allowJs: true, module: 'commonjs' } }],
    // kysely@0.29 ships ESM only too, in 300 files: transpiled only, with no type check, so a cold run stays quick.
    '/node_modules/kysely/.+\\.js$': [
      'ts-jest',
      { tsconfig: { allowJs: true, module: 'commonjs', isolatedModules: true } },
    ],
  },
  transformIgnorePatterns: ['^(?!.*/node_modules/(cookie|kysely)/).*/node_modules/'],
  testTimeout: 30000,
  // Two workers even on two cores: most long files wait on servers, child processes, leases and failovers rather
  // than compute, so a second file runs in those waits (sequencer.cjs starts the longest files first).
  maxWorkers: Math.max(2, availableParallelism() - 1),
  testSequencer: '<rootDir>/packages/testing/jest/sequencer.cjs',
  reporters: ['default', '<rootDir>/packages/testing/jest/reporter.cjs'],
};
