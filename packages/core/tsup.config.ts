import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries over one set of modules: shared code goes to one chunk, so a class (an error, the engine) is the
// same class whichever entry it was imported from, and `instanceof` holds across them.
export default defineConfig({ ...packageBuild, entry: ['src/index.ts', 'src/adapter.ts'], splitting: true });
