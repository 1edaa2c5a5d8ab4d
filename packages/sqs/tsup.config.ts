import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Two entries: the consumer wrappers, and the record translation @oncely/lambda shares without the SQS client.
export default defineConfig({
  ...packageBuild,
  entry: { index: 'src/index.ts', records: 'src/records/index.ts' },
  splitting: true,
});
