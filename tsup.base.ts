import type { Options } from 'tsup';

/**
 * The one build every package shares: ESM + CJS + declarations for both (.d.ts / .d.cts), Node 20.
 * esbuild's bundling already drops unused code; tsup's extra Rollup tree-shaking pass is off because it
 * duplicated the sourceMappingURL comment and warned about named + default exports in the CJS output.
 * `node:` specifiers are kept (tsup strips them by default), as the sources write them.
 */
export const packageBuild: Options = {
  entry: ['src/index.ts'],
  format: ['esm', 'cjs'],
  dts: true,
  clean: true,
  sourcemap: true,
  target: 'node20',
  platform: 'node',
  splitting: false,
  treeshake: false,
  removeNodeProtocol: false,
};
