// One jest run for every package: tests import sibling packages by name and are mapped to their
// TypeScript sources, so `npm test` needs no build first. A test file that needs a service names it in its opening
// docblock (`@services redis`); when one is down, its files are left out and the run says so in one line per
// service, then fails (packages/testing/jest/services.cjs).
/** @type {import('jest').Config} */
module.exports = {
  testEnvironment: 'node',
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
  },
  transformIgnorePatterns: ['^(?!.*/node_modules/cookie/).*/node_modules/'],
  testTimeout: 30000,
  testSequencer: '<rootDir>/packages/testing/jest/sequencer.cjs',
  reporters: ['default', '<rootDir>/packages/testing/jest/reporter.cjs'],
};
