// One jest run for every package: tests import sibling packages by name and are mapped to their
// TypeScript sources, so `pnpm test` needs no build first.
/** @type {import('jest').Config} */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/packages', '<rootDir>/examples'],
  testMatch: ['**/test/**/*.test.ts'],
  moduleNameMapper: {
    '^@oncely/([a-z-]+)$': '<rootDir>/packages/$1/src/index.ts',
  },
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.test.json' }],
    // cookie@2 (used by fastify.inject) ships ESM only, which jest cannot require on Node 20: transpile it.
    '/node_modules/cookie/.+\\.js$': ['ts-jest', { tsconfig: { allowJs: true, module: 'commonjs' } }],
  },
  transformIgnorePatterns: ['^(?!.*/node_modules/cookie/).*/node_modules/'],
  testTimeout: 30000,
};
