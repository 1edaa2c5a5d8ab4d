import type { Options } from 'tsup';

/** The one build every package shares: ESM + CJS + declarations for both, Node 20. */
export const packageBuild: Options = {
  entry: ['src/index.ts'],
  format: ['esm', 'cjs'],
  dts: true,
  clean: true,
  sourcemap: true,
  target: 'node20',
  splitting: false,
  treeshake: true,
};
