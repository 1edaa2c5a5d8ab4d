#!/usr/bin/env node
// An SQS server for examples and for tests run with SQS_ENDPOINT: fauxqs (installed by `npm run setup`) on
// 127.0.0.1:4566, or SQS_PORT, until Ctrl-C. It runs on a Node 22.5 or later: this one if it is, else the Node
// binary `npm run setup` installed from npm (packages/testing/jest/sqs-server-node.cjs says which and why).
// The tests need none of this: each test file starts a fauxqs of its own on a free port.
//
//   npm run sqs-server                       then: SQS_ENDPOINT=http://127.0.0.1:4566 npx jest packages/sqs/...
//   node scripts/sqs-server.mjs --check      says whether fauxqs can start here (or SQS_ENDPOINT answers); exit 1 if not
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';

const require = createRequire(import.meta.url);
const { CHILD, sqsServerNode, sqsServerProblem } = require('../packages/testing/jest/sqs-server-node.cjs');

if (process.argv.includes('--check')) {
  const named = process.env.SQS_ENDPOINT;
  if (named !== undefined && named !== '') {
    try {
      await fetch(named, { signal: AbortSignal.timeout(3000) });
      console.log(`sqs: SQS_ENDPOINT=${named} answers; tests use it`);
    } catch (error) {
      console.log(
        `sqs: SQS_ENDPOINT=${named} does not answer (${error.cause?.code ?? error.cause?.message ?? error.message})`,
      );
      process.exit(1);
    }
  } else {
    const problem = sqsServerProblem();
    if (problem !== undefined) {
      console.log(`sqs: tests cannot start fauxqs: ${problem}`);
      process.exit(1);
    }
    const node = sqsServerNode();
    console.log(`sqs: tests start fauxqs on Node ${node.version} (${node.from}): ${node.path}`);
  }
  process.exit(0);
}

const port = Number(process.env.SQS_PORT ?? 4566);
let node;
try {
  node = sqsServerNode();
} catch (error) {
  console.error(`sqs-server: ${error.message}`);
  process.exit(1);
}
const child = spawn(node.path, ['--disable-warning=ExperimentalWarning', CHILD, '--port', String(port)], {
  stdio: ['ignore', 'pipe', 'inherit'],
  env: { ...process.env, FAUXQS_LOGGER: process.env.FAUXQS_LOGGER ?? 'false' },
});
createInterface({ input: child.stdout }).once('line', (line) => {
  const { port: listening } = JSON.parse(line);
  console.log(
    `fauxqs (SQS) on Node ${node.version} (${node.from}) listens on port ${listening}; Ctrl-C stops it`,
  );
  console.log(`SQS_ENDPOINT=http://127.0.0.1:${listening}`);
});
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill('SIGTERM'));
child.on('exit', (code, signal) => process.exit(code ?? (signal === 'SIGTERM' ? 0 : 1)));
