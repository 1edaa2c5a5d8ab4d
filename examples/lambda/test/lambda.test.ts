import { runRootScriptToEnd } from '@oncely/testing';
import { expectReplayAndBatch } from './checks';

// `npm run example:lambda` exactly as the root README says, on its default MemoryStore: no service needed.
test('the HTTP retry is replayed and the SQS batch reports only the failed record', async () => {
  const { code, output } = await runRootScriptToEnd('example:lambda', [], { ONCELY_STORE: 'memory' });
  expect(code).toBe(0);
  expect(output[0]).toMatch(/^store: MemoryStore/);
  expectReplayAndBatch(output);
}, 60_000);
