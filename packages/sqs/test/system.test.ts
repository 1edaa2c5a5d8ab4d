/**
 * @services redis sqs-server
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import {
  GetQueueAttributesCommand,
  type Message,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import {
  type ConsumerProcess,
  createTestQueue,
  type SqsServer,
  sleep,
  startConsumerProcess,
  startSqsServer,
  type TestQueue,
  waitUntil,
} from '@oncely/testing';
import Redis from 'ioredis';

// @oncely/sqs end to end: the real @aws-sdk/client-sqs and sqs-consumer, consumers in processes of their own
// (test/fixtures/consumer.ts) sharing a RedisStore, on the SQS test server (fauxqs, or the server SQS_ENDPOINT
// names). The consumers journal every execution of the handler in Redis, awaited before the handler goes on, so
// the journal outlives a SIGKILL; everything in Redis lives under a prefix of this run, deleted in afterAll, and every
// queue is deleted in afterAll.
jest.setTimeout(150_000);

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const root = `oncely-sqs-system:${run}:`;
const script = join(__dirname, 'fixtures', 'consumer.ts');
const KEY = 'Idempotency-Key';

let server: SqsServer;
let sqs: SQSClient;
let redis: Redis;
const processes: ConsumerProcess[] = [];
const queues: TestQueue[] = [];

beforeAll(async () => {
  redis = new Redis(redisUrl);
  server = await startSqsServer();
  sqs = server.client();
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  for (const queue of queues) await queue.delete().catch(() => {});
  sqs?.destroy();
  await server?.stop();
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${root}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  await redis.quit();
});

async function queueFor(options: Parameters<typeof createTestQueue>[1]): Promise<TestQueue> {
  const queue = await createTestQueue(sqs, { prefix: `oncely-system-${run}`, ...options });
  queues.push(queue);
  return queue;
}

async function spawnConsumer(env: Record<string, string>): Promise<ConsumerProcess> {
  const p = await startConsumerProcess(script, {
    ...server.env,
    // The SDK warns once per process that its releases of 2027 need Node 22: said once by this process is enough.
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    REDIS_URL: redisUrl,
    ...env,
  });
  processes.push(p);
  return p;
}

/**
 * `n` consumers, started one after another: each has 20 s to get ready, and on a loaded machine several compiling
 * their sources at once can take longer than that.
 */
async function spawnConsumers(n: number, env: Record<string, string>): Promise<ConsumerProcess[]> {
  const out: ConsumerProcess[] = [];
  for (let i = 0; i < n; i++) out.push(await spawnConsumer(env));
  return out;
}

/** Every consumer of a test is stopped at its end: the next test has the machine's two cores to itself. */
async function stopAll(ps: readonly ConsumerProcess[]): Promise<void> {
  await Promise.all(ps.map((p) => p.kill()));
}

interface Send {
  key: string;
  body: string;
  group?: string;
}

/** Sends in order (batches of ten, `parallel` batches at a time) and returns the MessageIds, in the same order. */
async function sendAll(url: string, sends: readonly Send[], parallel = 8): Promise<string[]> {
  const batches: Send[][] = [];
  for (let i = 0; i < sends.length; i += 10) batches.push(sends.slice(i, i + 10));
  const ids: string[][] = new Array(batches.length);
  let next = 0;
  const worker = async () => {
    while (next < batches.length) {
      const index = next++;
      const batch = batches[index] as Send[];
      const out = await sqs.send(
        new SendMessageBatchCommand({
          QueueUrl: url,
          Entries: batch.map((s, i) => ({
            Id: String(i),
            MessageBody: s.body,
            MessageAttributes: { [KEY]: { DataType: 'String', StringValue: s.key } },
            ...(s.group === undefined ? {} : { MessageGroupId: s.group, MessageDeduplicationId: s.key }),
          })),
        }),
      );
      if ((out.Failed ?? []).length > 0)
        throw new Error(`SendMessageBatch failed: ${JSON.stringify(out.Failed)}`);
      const byId = new Map((out.Successful ?? []).map((s) => [s.Id, s.MessageId as string]));
      ids[index] = batch.map((_, i) => byId.get(String(i)) as string);
    }
  };
  // FIFO order is the order of the sends: one batch at a time.
  const lanes = sends.some((s) => s.group !== undefined) ? 1 : parallel;
  await Promise.all(Array.from({ length: lanes }, worker));
  return ids.flat();
}

/** Visible, in flight (received, not deleted) and delayed messages of a queue. */
async function counts(url: string): Promise<{ visible: number; inFlight: number; delayed: number }> {
  const { Attributes = {} } = await sqs.send(
    new GetQueueAttributesCommand({
      QueueUrl: url,
      AttributeNames: [
        'ApproximateNumberOfMessages',
        'ApproximateNumberOfMessagesNotVisible',
        'ApproximateNumberOfMessagesDelayed',
      ],
    }),
  );
  return {
    visible: Number(Attributes.ApproximateNumberOfMessages),
    inFlight: Number(Attributes.ApproximateNumberOfMessagesNotVisible),
    delayed: Number(Attributes.ApproximateNumberOfMessagesDelayed),
  };
}
/** `check`, asked at most every `ms` (waitUntil asks every 25 ms; a queue's counts need not be read that often). */
const slowly =
  (check: () => Promise<boolean>, ms = 250): (() => Promise<boolean>) =>
  async () => {
    await sleep(ms);
    return await check();
  };

const EMPTY = { visible: 0, inFlight: 0, delayed: 0 };
const isEmpty = async (url: string) => {
  const c = await counts(url);
  return c.visible === 0 && c.inFlight === 0 && c.delayed === 0;
};

/** Receives everything a queue holds (a dead-letter queue, at the end of a test). */
async function drain(url: string): Promise<Message[]> {
  const out: Message[] = [];
  for (;;) {
    const { Messages = [] } = await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: 10,
        MessageAttributeNames: ['All'],
        VisibilityTimeout: 60,
        WaitTimeSeconds: 0,
      }),
    );
    if (Messages.length === 0) return out;
    out.push(...Messages);
  }
}

/** What the consumers journaled under `prefix` (see fixtures/consumer.ts). */
async function recordsOf(prefix: string) {
  const [journal, receives, settled, processed, errors, attempts, maxRunning] = await Promise.all([
    redis.lrange(`${prefix}journal`, 0, -1),
    redis.lrange(`${prefix}receives`, 0, -1),
    redis.lrange(`${prefix}settled`, 0, -1),
    redis.lrange(`${prefix}processed`, 0, -1),
    redis.lrange(`${prefix}errors`, 0, -1),
    redis.hgetall(`${prefix}attempts`),
    redis.hgetall(`${prefix}max-running`),
  ]);
  const split = <T>(lines: string[], shape: (parts: string[]) => T) => lines.map((l) => shape(l.split(' ')));
  return {
    journal: split(journal, ([what, key, pid, messageId]) => ({
      what: what as string,
      key: key as string,
      pid: Number(pid),
      messageId: messageId as string,
    })),
    receives: split(receives, ([pid, messageId, key, count]) => ({
      pid: Number(pid),
      messageId: messageId as string,
      key: key as string,
      count: Number(count),
    })),
    settled: split(settled, ([pid, key, outcome, messageId]) => ({
      pid: Number(pid),
      key: key as string,
      outcome: outcome as string,
      messageId: messageId as string,
    })),
    processed: split(processed, ([pid, messageId]) => ({ pid: Number(pid), messageId: messageId as string })),
    errors,
    attempts: Object.fromEntries(Object.entries(attempts).map(([k, v]) => [k, Number(v)])),
    maxRunning: Object.fromEntries(Object.entries(maxRunning).map(([k, v]) => [k, Number(v)])),
  };
}

const tally = (values: readonly string[]) => {
  const out: Record<string, number> = {};
  for (const v of values) out[v] = (out[v] ?? 0) + 1;
  return out;
};

describe.each(['message', 'batch'] as const)('sqs-consumer %s handler', (mode) => {
  const wrapper = mode === 'message' ? 'idempotentHandleMessage' : 'idempotentHandleMessageBatch';

  test(`1,000 messages, 20% sent twice, 3 processes, one SIGKILLed holding messages (${wrapper}): every effect once`, async () => {
    const visibility = 3;
    const queue = await queueFor({ visibilityTimeout: visibility, deadLetter: { maxReceiveCount: 100 } });
    const prefix = `${root}crash-${mode}:`;
    const env = {
      QUEUE_URL: queue.url,
      DLQ_URL: queue.deadLetter?.url as string,
      PREFIX: prefix,
      MODE: mode,
      VISIBILITY_TIMEOUT: `${visibility}s`,
      IN_PROGRESS_DELAY: '500ms',
      WORK_MS: '20',
    };
    const consumers = await spawnConsumers(3, env);
    const [victim, ...survivors] = consumers as [ConsumerProcess, ...ConsumerProcess[]];

    // 1,000 keys; 200 sent twice under two MessageIds: 100 right behind the first send (they race it) and 100 at the
    // end (they find it done).
    const keys = Array.from({ length: 1000 }, (_, i) => `order-${i}`);
    const sends: Send[] = [];
    keys.forEach((key, i) => {
      sends.push({ key, body: `{"order":${i}}` });
      if (i % 10 === 0) sends.push({ key, body: `{"order":${i}}` });
    });
    for (let i = 5; i < keys.length; i += 10) sends.push({ key: keys[i] as string, body: `{"order":${i}}` });
    const sentIds = await sendAll(queue.url, sends);
    expect(new Set(sentIds).size).toBe(1200);

    // Once every message is sent, the victim freezes: each handler call it starts from then on hangs, the first
    // after its effect (made, never recorded), the next before it, and so on. It is killed once it is frozen and
    // everything else it ran is recorded: what it holds is then exactly its hung calls, and the effects it made and
    // did not record are exactly the `hang-after` ones.
    await redis.set(`${prefix}freeze:${victim.pid}`, '1');
    const calls = async () => {
      const c = await redis.hgetall(`${prefix}calls:${victim.pid}`);
      const n = (field: string) => Number(c[field] ?? 0);
      return { starts: n('starts'), ends: n('ends'), hung: n('hung'), executed: n('ack:executed') };
    };
    await waitUntil(
      slowly(async () => {
        const c = await calls();
        return c.hung > 0 && c.starts === c.ends + c.hung && c.executed === c.ends;
      }),
      'the victim to freeze with its finished executions recorded',
      90_000,
    );
    const atKill = await calls();
    await victim.kill();

    await waitUntil(
      slowly(() => isEmpty(queue.url)),
      'every message deleted',
      120_000,
    );
    const r = await recordsOf(prefix);
    await stopAll(survivors);

    // Nothing dead-lettered, nothing lost.
    expect(await counts(queue.deadLetter?.url as string)).toEqual(EMPTY);
    const effects = r.journal.filter((e) => e.what === 'effect');
    const effectsByKey = new Map<string, typeof effects>();
    for (const e of effects) effectsByKey.set(e.key, [...(effectsByKey.get(e.key) ?? []), e]);
    expect([...effectsByKey.keys()].sort()).toEqual([...keys].sort());

    // Every effect once per key, except those the victim made and never recorded: exactly those ran twice, first in
    // the victim, then in a survivor.
    const hungAfter = r.journal.filter((e) => e.what === 'hang-after').map((e) => e.key);
    const hungBefore = r.journal.filter((e) => e.what === 'hang-before').map((e) => e.key);
    expect(hungAfter.length).toBeGreaterThan(0);
    expect(hungAfter.length + hungBefore.length).toBe(atKill.hung);
    const recordedByVictim = new Set(
      r.settled.filter((s) => s.pid === victim.pid && s.outcome === 'ack:executed').map((s) => s.key),
    );
    const unrecorded = [...new Set(effects.filter((e) => e.pid === victim.pid).map((e) => e.key))].filter(
      (key) => !recordedByVictim.has(key),
    );
    expect(unrecorded.sort()).toEqual([...hungAfter].sort());
    const repeated = [...effectsByKey].filter(([, list]) => list.length !== 1);
    expect(repeated.map(([key]) => key).sort()).toEqual([...hungAfter].sort());
    for (const [key, list] of repeated) {
      expect({ key, runs: list.map((e) => (e.pid === victim.pid ? 'victim' : 'survivor')) }).toEqual({
        key,
        runs: ['victim', 'survivor'],
      });
    }
    // Every key was executed and recorded exactly once.
    expect(r.settled.filter((s) => s.outcome === 'ack:executed').length).toBe(1000);
    // No two executions of a key ran at once, but for the hung ones (the victim's never ended).
    const hung = new Set([...hungAfter, ...hungBefore]);
    expect(Object.entries(r.maxRunning).filter(([key, n]) => n > 1 && !hung.has(key))).toEqual([]);

    // Redelivery happened: every message the victim held came back (after its visibility ran out) to a survivor.
    const hungMessages = r.journal.filter((e) => e.what.startsWith('hang')).map((e) => e.messageId);
    for (const id of hungMessages) {
      const again = r.receives.filter((x) => x.messageId === id && x.pid !== victim.pid);
      expect({ id, redelivered: again.length > 0 && again.every((x) => x.count >= 2) }).toEqual({
        id,
        redelivered: true,
      });
    }
    const redeliveries = r.receives.filter((x) => x.count >= 2).length;
    expect(redeliveries).toBeGreaterThanOrEqual(hungMessages.length);
    // Every message was received, and every process did work.
    expect(new Set(r.receives.map((x) => x.messageId))).toEqual(new Set(sentIds));
    expect(new Set(effects.map((e) => e.pid))).toEqual(new Set(consumers.map((c) => c.pid)));

    console.log(
      `sqs ${mode}: 1,200 sends, ${r.receives.length} receives (${redeliveries} redeliveries); victim held ${atKill.hung} (${hungAfter.length} after the effect) at the kill; ` +
        `settled ${JSON.stringify(tally(r.settled.map((s) => s.outcome)))}; deletes seen ${r.processed.length}; consumer errors ${r.errors.length}${r.errors.length > 0 ? ` (first: ${r.errors[0]})` : ''}`,
    );
  });
});

test('a handler slower than the visibility timeout is never run twice at once: the heartbeat extends both', async () => {
  // Long enough that a late heartbeat on a loaded machine (it renews every third of it) does not let it lapse.
  const visibility = 3;
  const queue = await queueFor({ visibilityTimeout: visibility, deadLetter: { maxReceiveCount: 100 } });
  const prefix = `${root}slow:`;
  const env = {
    QUEUE_URL: queue.url,
    DLQ_URL: queue.deadLetter?.url as string,
    PREFIX: prefix,
    MODE: 'message',
    VISIBILITY_TIMEOUT: `${visibility}s`,
    IN_PROGRESS_DELAY: '500ms',
    HOLD: 'true',
  };
  // A takes the three messages and holds them (its handler waits for the test's word); B, started then, polls the
  // same queue all along and gets a second send of each key.
  const a = await spawnConsumer(env);
  const keys = ['slow-1', 'slow-2', 'slow-3'];
  const firstIds = await sendAll(
    queue.url,
    keys.map((key) => ({ key, body: `{"slow":"${key}"}` })),
  );
  const attempts = async () => Object.keys(await redis.hgetall(`${prefix}attempts`)).length;
  await waitUntil(
    slowly(async () => (await attempts()) === 3),
    'A to start the three keys',
    30_000,
  );
  const started = Date.now();
  const b = await spawnConsumer(env);
  const secondIds = await sendAll(
    queue.url,
    keys.map((key) => ({ key, body: `{"slow":"${key}"}` })),
  );
  // Held past three visibility timeouts (and three leases), then one more look by B per key found it still held.
  const inProgress = async () => {
    const settled = (await recordsOf(prefix)).settled.filter((s) => s.outcome === 'delay:in-progress');
    return keys.map((key) => settled.filter((s) => s.key === key).length);
  };
  await waitUntil(
    slowly(async () => Date.now() - started >= 3 * visibility * 1000),
    'three visibility timeouts',
    30_000,
  );
  const before = await inProgress();
  await waitUntil(
    slowly(async () => (await inProgress()).every((n, i) => n > (before[i] as number))),
    'B to find each key still held',
    30_000,
  );
  const heldMs = Date.now() - started;
  await redis.set(`${prefix}release`, '1');
  await waitUntil(
    slowly(() => isEmpty(queue.url)),
    'every message deleted',
    60_000,
  );
  const r = await recordsOf(prefix);
  await stopAll([a, b]);

  // Each key ran once, in A, and never alongside another run; its second send was replayed.
  expect(r.attempts).toEqual(Object.fromEntries(keys.map((k) => [k, 1])));
  expect(r.maxRunning).toEqual(Object.fromEntries(keys.map((k) => [k, 1])));
  const effects = r.journal.filter((e) => e.what === 'effect');
  expect(effects.map((e) => `${e.key} ${e.pid}`).sort()).toEqual(keys.map((k) => `${k} ${a.pid}`));
  for (const key of keys) {
    const outcomes = r.settled
      .filter((s) => s.key === key && s.outcome.startsWith('ack:'))
      .map((s) => s.outcome);
    expect({ key, outcomes: outcomes.sort() }).toEqual({ key, outcomes: ['ack:executed', 'ack:replayed'] });
  }
  // The first sends stayed invisible to B all along: each was received once, by A.
  expect(r.receives.filter((x) => firstIds.includes(x.messageId)).map((x) => `${x.pid} ${x.count}`)).toEqual(
    firstIds.map(() => `${a.pid} 1`),
  );
  expect(new Set(r.receives.filter((x) => secondIds.includes(x.messageId)).map((x) => x.pid))).toContain(
    b.pid,
  );
  expect(await counts(queue.deadLetter?.url as string)).toEqual(EMPTY);
  console.log(
    `sqs slow handler: held ${heldMs}ms with a ${visibility}s visibility timeout and lease; ` +
      `B found the keys held ${(await inProgress()).join('/')} times; settled ${JSON.stringify(tally(r.settled.map((s) => s.outcome)))}`,
  );
});

describe.each(['message', 'batch'] as const)('FIFO with sqs-consumer %s handler', (mode) => {
  test('a failed message holds its group back until it succeeds; the other groups go on; order per group kept', async () => {
    const queue = await queueFor({ fifo: true, visibilityTimeout: 3, deadLetter: { maxReceiveCount: 50 } });
    const prefix = `${root}fifo-${mode}:`;
    const groups = ['g0', 'g1', 'g2', 'g3'];
    const perGroup = 12;
    const failing = 'g1-2';
    const env = {
      QUEUE_URL: queue.url,
      DLQ_URL: queue.deadLetter?.url as string,
      PREFIX: prefix,
      MODE: mode,
      VISIBILITY_TIMEOUT: '3s',
      IN_PROGRESS_DELAY: '500ms',
      RETRY_DELAY: '1s',
      MAX_ATTEMPTS: '5',
      FAIL_KEY: failing,
      FAIL_TIMES: '2',
      WORK_MS: '20',
    };
    const consumers = await spawnConsumers(2, env);
    // Interleaved: g0-0, g1-0, g2-0, g3-0, g0-1, ...
    const sends: Send[] = [];
    for (let i = 0; i < perGroup; i++) {
      for (const group of groups) sends.push({ key: `${group}-${i}`, body: `{"n":${i}}`, group });
    }
    await sendAll(queue.url, sends);
    await waitUntil(
      slowly(() => isEmpty(queue.url)),
      'every message deleted',
      90_000,
    );
    const r = await recordsOf(prefix);
    await stopAll(consumers);

    // Each group ran in the order it was sent, each message once.
    const effects = r.journal.filter((e) => e.what === 'effect');
    for (const group of groups) {
      expect({
        group,
        order: effects.filter((e) => e.key.startsWith(`${group}-`)).map((e) => e.key),
      }).toEqual({
        group,
        order: Array.from({ length: perGroup }, (_, i) => `${group}-${i}`),
      });
    }
    // The failing message ran three times; no later message of its group started before it succeeded.
    expect(r.attempts[failing]).toBe(3);
    const at = (what: string, key: string) => r.journal.findIndex((e) => e.what === what && e.key === key);
    const firstFailure = at('fail', failing);
    const success = at('effect', failing);
    expect(firstFailure).toBeGreaterThanOrEqual(0);
    const laterStarts = r.journal
      .slice(0, success)
      .filter((e) => e.what === 'start' && e.key.startsWith('g1-') && Number(e.key.slice(3)) > 2);
    expect(laterStarts).toEqual([]);
    // The other groups were not held back: each either had finished before the failure or ran while g1 waited.
    for (const group of groups.filter((g) => g !== 'g1')) {
      const positions = r.journal
        .map((e, i) => (e.what === 'effect' && e.key.startsWith(`${group}-`) ? i : -1))
        .filter((i) => i >= 0);
      const finishedBefore = (positions.at(-1) as number) < firstFailure;
      const ranMeanwhile = positions.some((i) => i > firstFailure && i < success);
      expect({ group, wentOn: finishedBefore || ranMeanwhile }).toEqual({ group, wentOn: true });
    }
    expect(r.settled.filter((s) => s.key === failing).map((s) => s.outcome)).toEqual([
      'retry:failed',
      'retry:failed',
      'ack:executed',
    ]);
    expect(await counts(queue.deadLetter?.url as string)).toEqual(EMPTY);
    console.log(
      `sqs FIFO ${mode}: ${sends.length} messages in ${groups.length} groups, ${r.receives.length} receives; settled ${JSON.stringify(tally(r.settled.map((s) => s.outcome)))}`,
    );
  });
});

describe.each([
  ['deadLetterQueueUrl', 'the wrapper sends it to the dead-letter queue it was given'],
  ['redrive policy', "the wrapper leaves it to the queue's redrive policy"],
] as const)('dead-lettering after maxAttempts (%s)', (how, what) => {
  test(`${what}: it lands there once, after exactly maxAttempts runs`, async () => {
    const maxAttempts = 3;
    const viaRedrive = how === 'redrive policy';
    const queue = await queueFor({
      visibilityTimeout: 2,
      ...(viaRedrive ? { deadLetter: { maxReceiveCount: maxAttempts } } : {}),
    });
    const dlq = viaRedrive
      ? (queue.deadLetter as NonNullable<TestQueue['deadLetter']>)
      : await queueFor({ prefix: `oncely-system-${run}-dlq` });
    const prefix = `${root}dlq-${viaRedrive ? 'redrive' : 'url'}:`;
    const env = {
      QUEUE_URL: queue.url,
      ...(viaRedrive ? {} : { DLQ_URL: dlq.url }),
      PREFIX: prefix,
      MODE: 'message',
      VISIBILITY_TIMEOUT: '2s',
      RETRY_DELAY: '200ms',
      MAX_ATTEMPTS: String(maxAttempts),
      FAIL_KEY: 'poison',
      FAIL_TIMES: '1000',
    };
    const consumers = await spawnConsumers(2, env);
    const sends = ['poison', 'good-1', 'good-2', 'good-3'].map((key) => ({ key, body: `{"k":"${key}"}` }));
    const [poisonId] = await sendAll(queue.url, sends);
    await waitUntil(
      slowly(async () => (await counts(dlq.url)).visible >= 1),
      'the poison message in the dead-letter queue',
      60_000,
    );
    // A second copy, or the original left behind, would show within a visibility timeout or two.
    await sleep(3000);
    const r = await recordsOf(prefix);
    await stopAll(consumers);

    expect(await counts(queue.url)).toEqual(EMPTY);
    const dead = await drain(dlq.url);
    expect(dead.map((m) => [m.Body, m.MessageAttributes?.[KEY]?.StringValue])).toEqual([
      ['{"k":"poison"}', 'poison'],
    ]);
    if (viaRedrive) expect(dead[0]?.MessageId).toBe(poisonId);
    expect(r.attempts.poison).toBe(maxAttempts);
    expect(r.journal.filter((e) => e.what === 'fail').length).toBe(maxAttempts);
    // The good messages ran once each, untouched by the poison one.
    expect(
      r.journal
        .filter((e) => e.what === 'effect')
        .map((e) => e.key)
        .sort(),
    ).toEqual(['good-1', 'good-2', 'good-3']);
    console.log(
      `sqs dead-letter (${how}): ${r.receives.filter((x) => x.key === 'poison').length} receives of the poison message; settled ${JSON.stringify(tally(r.settled.map((s) => s.outcome)))}`,
    );
  });
});
