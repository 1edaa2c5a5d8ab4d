import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import type { SQSClient, SQSClientConfig } from '@aws-sdk/client-sqs';
import { CHILD, sqsServerNode } from '../jest/sqs-server-node.cjs';

export { type SqsServerNode, sqsServerNode, sqsServerProblem } from '../jest/sqs-server-node.cjs';

const REGION = 'us-east-1';

/** What the SDK needs to reach a local SQS server: any non-empty keys do, nothing is signed against AWS. */
const LOCAL_CREDENTIALS = { accessKeyId: 'test', secretAccessKey: 'test' };

/** An SQS server for tests: fauxqs in a child process, or the one `SQS_ENDPOINT` names. */
export interface SqsServer {
  /** `http://127.0.0.1:<port>`: give it to every SQSClient as `endpoint`. */
  endpoint: string;
  region: string;
  /** `fauxqs` when this process started it, `external` when `SQS_ENDPOINT` named it (then `stop()` leaves it). */
  kind: 'fauxqs' | 'external';
  /** endpoint, region and credentials for `new SQSClient(...)`. */
  clientConfig: SQSClientConfig;
  /** A new SQSClient on this server (the caller destroys it). */
  client(): SQSClient;
  /**
   * The environment a child process needs to reach this server: SQS_ENDPOINT, AWS_ENDPOINT_URL_SQS (so that an
   * SQSClient made with no `endpoint`, such as sqs-consumer's default one, comes here too), AWS_REGION,
   * AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the last two unless the server is external and the environment has
   * credentials).
   */
  env: Record<string, string>;
  /** Stops the server this process started (waits for its exit); does nothing for an external one. */
  stop(): Promise<void>;
}

/** Keeps the last lines a child wrote on stderr, for the error when it fails to start. */
function tail(child: ChildProcess, lines: string[]): void {
  if (child.stderr === null) return;
  createInterface({ input: child.stderr }).on('line', (line) => {
    lines.push(line);
    if (lines.length > 20) lines.shift();
  });
}

async function answers(url: string, timeoutMs = 5000): Promise<Response> {
  return await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
}

async function loadSdk(): Promise<typeof import('@aws-sdk/client-sqs')> {
  return await import('@aws-sdk/client-sqs');
}

function server(
  endpoint: string,
  kind: SqsServer['kind'],
  sdk: typeof import('@aws-sdk/client-sqs'),
  stop: () => Promise<void>,
): SqsServer {
  const external = kind === 'external';
  const ownCredentials =
    external &&
    process.env.AWS_ACCESS_KEY_ID !== undefined &&
    process.env.AWS_SECRET_ACCESS_KEY !== undefined;
  const region =
    (external ? (process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION) : undefined) ?? REGION;
  const clientConfig: SQSClientConfig = {
    endpoint,
    region,
    ...(ownCredentials ? {} : { credentials: LOCAL_CREDENTIALS }),
  };
  return {
    endpoint,
    region,
    kind,
    clientConfig,
    client: () => new sdk.SQSClient(clientConfig),
    env: {
      SQS_ENDPOINT: endpoint,
      AWS_ENDPOINT_URL_SQS: endpoint,
      AWS_REGION: region,
      ...(ownCredentials
        ? {}
        : {
            AWS_ACCESS_KEY_ID: LOCAL_CREDENTIALS.accessKeyId,
            AWS_SECRET_ACCESS_KEY: LOCAL_CREDENTIALS.secretAccessKey,
          }),
    },
    stop,
  };
}

/**
 * An SQS server for a test file: the one `SQS_ENDPOINT` names when that is set (checked to answer HTTP), else
 * fauxqs started on a free port in a child process on a Node 22.5 or later (see `sqsServerNode()`),
 * ready once it answers `/health`. The child exits when `stop()` is called, when this process exits, and when this
 * process dies without a word (it watches its stdin, a pipe from here). Call `stop()` in `afterAll`.
 */
export async function startSqsServer(options: { port?: number } = {}): Promise<SqsServer> {
  const sdk = await loadSdk();
  const named = process.env.SQS_ENDPOINT;
  if (named !== undefined && named !== '') {
    const endpoint = named.replace(/\/+$/, '');
    try {
      await answers(endpoint);
    } catch (error) {
      throw new Error(
        `SQS_ENDPOINT=${named} does not answer (${(error as Error).message}): start that server ` +
          '(docker compose up -d sqs, or npm run sqs-server), or unset SQS_ENDPOINT to let the test start its own',
      );
    }
    return server(endpoint, 'external', sdk, async () => {});
  }

  const node = sqsServerNode();
  const stderr: string[] = [];
  const child = spawn(
    node.path,
    ['--disable-warning=ExperimentalWarning', CHILD, '--port', String(options.port ?? 0), '--watch-stdin'],
    {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, FAUXQS_LOGGER: process.env.FAUXQS_LOGGER ?? 'false' },
    },
  );
  tail(child, stderr);
  const gone = () => child.exitCode !== null || child.signalCode !== null;
  const killAtExit = () => {
    if (!gone()) child.kill('SIGKILL');
  };
  process.on('exit', killAtExit);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));

  const failed = (why: string) =>
    new Error(
      `fauxqs (the SQS test server, on ${node.path}, Node ${node.version} from ${node.from}) ${why}` +
        (stderr.length > 0 ? `:\n${stderr.join('\n')}` : ''),
    );
  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(failed('did not listen within 30 s')), 30_000);
      const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
      lines.once('line', (line) => {
        clearTimeout(timer);
        const parsed = /^\{"port":(\d+)\}$/.exec(line.trim());
        if (parsed === null) reject(failed(`printed ${JSON.stringify(line)} instead of its port`));
        else resolve(Number(parsed[1]));
      });
      child.once('error', (error) => {
        clearTimeout(timer);
        reject(failed(`could not start: ${error.message}`));
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        // Let the stderr lines arrive before saying what they were.
        setImmediate(() => reject(failed(`exited (${signal ?? `code ${code}`}) before it listened`)));
      });
    });
    const endpoint = `http://127.0.0.1:${port}`;
    const health = await answers(`${endpoint}/health`);
    if (!health.ok) throw failed(`answered /health with ${health.status}`);
  } catch (error) {
    killAtExit();
    await exited;
    process.off('exit', killAtExit);
    throw error;
  }
  // Nothing of the child keeps this process alive: a test that forgets stop() still ends (and takes it along).
  child.unref();
  for (const stream of [child.stdin, child.stdout, child.stderr]) {
    (stream as unknown as { unref?: () => void } | null)?.unref?.();
  }
  return server(`http://127.0.0.1:${port}`, 'fauxqs', sdk, async () => {
    if (!gone()) {
      child.kill('SIGTERM');
      const timer = setTimeout(killAtExit, 5000);
      await exited;
      clearTimeout(timer);
    }
    process.off('exit', killAtExit);
  });
}

/** What `createTestQueue` makes. */
export interface TestQueueOptions {
  /** A FIFO queue (its name ends in `.fifo`; so does its dead-letter queue's). */
  fifo?: boolean;
  /** FIFO only: deduplicate by the body's SHA-256 when a send has no MessageDeduplicationId. */
  contentBasedDeduplication?: boolean;
  /** Seconds; SQS's default is 30. */
  visibilityTimeout?: number;
  /** A dead-letter queue of its own (same type), with this redrive policy's maxReceiveCount. */
  deadLetter?: { maxReceiveCount: number };
  /** More queue attributes, as SQS names them (e.g. `ReceiveMessageWaitTimeSeconds`). */
  attributes?: Record<string, string>;
  /** The start of the queue's name (letters, digits, `-`, `_`); a unique suffix follows. */
  prefix?: string;
}

export interface TestQueue {
  name: string;
  url: string;
  arn: string;
  /** The queue its redrive policy sends to, when `deadLetter` was asked for. */
  deadLetter?: { name: string; url: string; arn: string };
  /** Deletes the queue and its dead-letter queue (ignores one already gone). */
  delete(): Promise<void>;
}

/** `<prefix>-<id><suffix>`, within the 80 characters SQS allows (`.fifo` included). */
function queueName(prefix: string, id: string, suffix: string, fifo: boolean): string {
  const base = `${prefix.slice(0, 75 - id.length - suffix.length - 1)}-${id}${suffix}`;
  return fifo ? `${base}.fifo` : base;
}

/**
 * Creates a uniquely named queue on the server `client` talks to: standard or FIFO, with a visibility timeout, and
 * with a dead-letter queue of its own and a redrive policy to it when `deadLetter` is given.
 */
export async function createTestQueue(client: SQSClient, options: TestQueueOptions = {}): Promise<TestQueue> {
  const { CreateQueueCommand, DeleteQueueCommand, GetQueueAttributesCommand } = await loadSdk();
  const fifo = options.fifo === true;
  const prefix = options.prefix ?? 'oncely-test';
  const typeAttributes: Record<string, string> = fifo
    ? {
        FifoQueue: 'true',
        ...(options.contentBasedDeduplication === true ? { ContentBasedDeduplication: 'true' } : {}),
      }
    : {};
  const create = async (name: string, attributes: Record<string, string>) => {
    const { QueueUrl } = await client.send(
      new CreateQueueCommand({ QueueName: name, Attributes: attributes }),
    );
    if (QueueUrl === undefined) throw new Error(`CreateQueue ${name} answered without a QueueUrl`);
    const { Attributes } = await client.send(
      new GetQueueAttributesCommand({ QueueUrl, AttributeNames: ['QueueArn'] }),
    );
    const arn = Attributes?.QueueArn;
    if (arn === undefined) throw new Error(`GetQueueAttributes ${name} answered without a QueueArn`);
    return { name, url: QueueUrl, arn };
  };
  const remove = async (url: string) => {
    await client.send(new DeleteQueueCommand({ QueueUrl: url })).catch((error: { name?: string }) => {
      if (error.name !== 'QueueDoesNotExist' && error.name !== 'AWS.SimpleQueueService.NonExistentQueue')
        throw error;
    });
  };

  // Unique per call: no other test, and no earlier run against a long-lived server, has this name.
  const id = randomUUID().replace(/-/g, '').slice(0, 12);
  const deadLetter =
    options.deadLetter === undefined
      ? undefined
      : await create(queueName(prefix, id, '-dlq', fifo), { ...typeAttributes });
  const queue = await create(queueName(prefix, id, '', fifo), {
    ...typeAttributes,
    ...(options.visibilityTimeout === undefined
      ? {}
      : { VisibilityTimeout: String(options.visibilityTimeout) }),
    ...(deadLetter === undefined || options.deadLetter === undefined
      ? {}
      : {
          RedrivePolicy: JSON.stringify({
            deadLetterTargetArn: deadLetter.arn,
            maxReceiveCount: options.deadLetter.maxReceiveCount,
          }),
        }),
    ...options.attributes,
  });
  return {
    ...queue,
    ...(deadLetter === undefined ? {} : { deadLetter }),
    delete: async () => {
      await remove(queue.url);
      if (deadLetter !== undefined) await remove(deadLetter.url);
    },
  };
}
