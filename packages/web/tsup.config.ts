import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries over one set of modules: shared code goes to one chunk, so `HandlerFailure` and `KnownBody` are the
// same classes for @oncely/hono (through ./adapter) as for withIdempotency.
export default defineConfig({
  ...packageBuild,
  entry: { index: 'src/index.ts', adapter: 'src/adapter/index.ts' },
  splitting: true,
});
