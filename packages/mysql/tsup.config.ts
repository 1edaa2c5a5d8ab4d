import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries: the store, and `@oncely/mysql/records` (how records are laid out, for tools such as `oncely`).
export default defineConfig({
  ...packageBuild,
  entry: { index: 'src/index.ts', records: 'src/records/index.ts' },
  splitting: true,
});
