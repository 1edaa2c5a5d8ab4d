import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries: the main one, and `@oncely/core/node` for the Node adapters (it imports only types of the main one,
// so nothing is bundled twice).
export default defineConfig({ ...packageBuild, entry: { index: 'src/index.ts', node: 'src/node/index.ts' } });
