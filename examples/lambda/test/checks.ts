// What every run of the example must print, whatever the store.
export function expectReplayAndBatch(output: string[]): void {
  const line = (pattern: RegExp) => output.filter((l) => pattern.test(l));
  // HTTP: one execution, the retry replayed with the same body.
  expect(line(/^charge ch_\d+ created/)).toHaveLength(1);
  const first = line(/^first: /)[0];
  const retry = line(/^retry: /)[0];
  expect(first).toMatch(/^first: 201 Idempotent-Replayed: \(absent\) body: \{"id":"ch_1","amount":1000\}$/);
  expect(retry).toMatch(/^retry: 201 Idempotent-Replayed: true body: \{"id":"ch_1","amount":1000\}$/);
  expect(output).toContain('charges executed: 1');
  // SQS: order A (twice in the batch) charged once, order C's failure reported, nothing else.
  expect(line(/^order order-A-\w+: charged 1000/)).toHaveLength(1);
  expect(line(/^order order-B-\w+: charged 2500/)).toHaveLength(1);
  expect(line(/^order order-C-/)).toHaveLength(0);
  expect(output).toContain('batch response: {"batchItemFailures":[{"itemIdentifier":"m-4"}]}');
  expect(output).toContain('orders executed: A 1, B 1, C 0');
}
