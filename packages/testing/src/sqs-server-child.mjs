// Runs fauxqs (the SQS emulator) for startSqsServer() in sqs-server.ts, on a Node >= 22.5 that may not be the one
// running the tests. Prints one JSON line, {"port":N}, once it listens; exits on SIGTERM or SIGINT and, with
// --watch-stdin, when its stdin ends: that is when the process that started it is gone, so a SIGKILLed jest worker
// leaves no server behind.
//
//   node sqs-server-child.mjs [--port N] [--watch-stdin]    port 0 (the default): the OS picks a free one
import { buildApp } from 'fauxqs';

const args = process.argv.slice(2);
const portAt = args.indexOf('--port');
const port = portAt === -1 ? 0 : Number(args[portAt + 1]);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`sqs-server-child: --port takes a port number (0 for any free one), not ${args[portAt + 1]}`);
  process.exit(2);
}
// buildApp rather than startFauxqs: the latter listens on every interface, a test server needs loopback only.
// Its SqsStore with an empty host: queue URLs then name the address the request came to
// (http://127.0.0.1:<port>/000000000000/<name>) rather than http://sqs.us-east-1.localhost:<port>/…, which does
// not resolve. An SDK client whose endpoint comes from AWS_ENDPOINT_URL_SQS (or from no setting at all) sends each
// request to its QueueUrl's host; only one given `endpoint` in code ignores it. fauxqs does not export the class,
// so it is imported from its file, beside the entry point.
const { SqsStore } = await import(new URL('./sqs/sqsStore.js', import.meta.resolve('fauxqs')).href);
const sqsStore = new SqsStore();
sqsStore.host = '';
const app = buildApp({ logger: process.env.FAUXQS_LOGGER === 'true', stores: { sqsStore } });
const listening = Number(new URL(await app.listen({ port, host: '127.0.0.1' })).port);

let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  const force = setTimeout(() => process.exit(0), 2000);
  force.unref();
  await app.close().catch(() => {});
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
if (args.includes('--watch-stdin')) {
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();
}

process.stdout.write(`${JSON.stringify({ port: listening })}\n`);
