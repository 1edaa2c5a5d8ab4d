import { readFileSync } from 'node:fs';
import { join } from 'node:path';

// docs/consumers.md shows these files whole; this keeps the page and the type-checked code the same.
const docs = readFileSync(join(__dirname, '..', '..', '..', 'docs', 'consumers.md'), 'utf8');
const blocks = [...docs.matchAll(/```ts\n([\s\S]*?)```/g)].map((match) => match[1]);

test.each(['kafka.ts', 'confluent.ts', 'sqs.ts'])('docs/consumers.md shows %s as it is', (file) => {
  const code = readFileSync(join(__dirname, '..', file), 'utf8');
  expect(blocks).toContain(code);
});
