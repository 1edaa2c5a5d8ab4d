import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries: the library (`main(argv, io)`, the backend interface) and the `oncely` bin. Each backend is its own
// chunk, loaded only for the store its URL names, so that a Redis user needs no AWS SDK and the other way round.
export default defineConfig({
  ...packageBuild,
  entry: { index: 'src/index.ts', bin: 'src/bin.ts' },
  splitting: true,
});
