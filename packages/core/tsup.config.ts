import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Three entries over one set of modules: the main one, `@oncely/core/adapter` for adapter and store authors, and
// `@oncely/core/node` for the Node adapters. Shared code goes to one chunk, so a class (an error, the engine) is the
// same class whichever entry it was imported from, and `instanceof` holds across them.
export default defineConfig({
  ...packageBuild,
  entry: { index: 'src/index.ts', adapter: 'src/adapter/index.ts', node: 'src/node/index.ts' },
  splitting: true,
});
