import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sleep } from './consumers';

// Shared by the SIGKILL crash tests of step(): an app (or worker) runs three steps per key (a local write, a charge
// at a provider that honours Idempotency-Key, an outbox row), is killed at random points and restarted; these
// helpers run the provider and the kill loop, and check what the survivors left behind.

/** One call the provider received: which order it charged, under which Idempotency-Key, from which process. */
export interface ProviderCall {
  order: string;
  idempotencyKey: string;
  pid: number;
}

/** A payment provider in the test process: one charge per Idempotency-Key, a replay of it for every repeat. */
export interface ChargeProvider {
  url: string;
  /** Every call in arrival order. */
  readonly calls: readonly ProviderCall[];
  /** Charges executed, by Idempotency-Key (each key executes once, by construction): its order and charge id. */
  readonly charges: ReadonlyMap<string, { order: string; chargeId: string }>;
  close(): Promise<void>;
}

/**
 * Starts the provider: `POST /charges` with `Idempotency-Key`, `X-Order` (the order's own key) and `X-Pid` (the
 * caller's process) answers `{ "id": chargeId }` after `delayMs`, so a caller killed while it waits has charged
 * without learning the id: its retry must send the same Idempotency-Key to get the same charge.
 */
export async function startChargeProvider(delayMs: number): Promise<ChargeProvider> {
  const calls: ProviderCall[] = [];
  const charges = new Map<string, { order: string; chargeId: string }>();
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const idempotencyKey = req.headers['idempotency-key'];
      const order = req.headers['x-order'];
      if (req.method !== 'POST' || typeof idempotencyKey !== 'string' || typeof order !== 'string') {
        res.writeHead(400).end('POST with Idempotency-Key and X-Order');
        return;
      }
      calls.push({ order, idempotencyKey, pid: Number(req.headers['x-pid']) });
      let charge = charges.get(idempotencyKey);
      if (charge === undefined) {
        charge = { order, chargeId: `ch_${charges.size + 1}` };
        charges.set(idempotencyKey, charge);
      }
      const body = JSON.stringify({ id: charge.chargeId });
      setTimeout(() => {
        if (!res.destroyed) res.writeHead(200, { 'content-type': 'application/json' }).end(body);
      }, delayMs);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/charges`,
    calls,
    charges,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The key `keyFor(name)` gives under the store key `storeKey`, computed from the documented formula. */
export function expectedKeyFor(storeKey: string, name: string): string {
  return createHash('sha256')
    .update(JSON.stringify(['oncely.keyFor.v1', storeKey, name]))
    .digest('base64url');
}

export interface Killable {
  child: ChildProcess;
  kill(): Promise<void>;
}

/**
 * Starts a process and, once it made progress (`progress()`, a count of answers or jobs done, grew), lets it run a
 * random time in `upMs` more, so that work is in flight, then SIGKILLs it and starts the next: `kills` times or
 * until `done()`. Resolves with the process left running and the pids killed.
 */
export async function killRepeatedly<P extends Killable>(options: {
  start: () => Promise<P>;
  kills: number;
  upMs: readonly [number, number];
  progress: () => number;
  done: () => boolean;
}): Promise<{ survivor: P; killed: Set<number> }> {
  const killed = new Set<number>();
  let current = await options.start();
  while (killed.size < options.kills && !options.done()) {
    const baseline = options.progress();
    while (options.progress() === baseline && !options.done()) await sleep(10);
    const [min, max] = options.upMs;
    const until = Date.now() + min + Math.random() * (max - min);
    while (Date.now() < until && !options.done()) await sleep(10);
    if (options.done()) break;
    await current.kill();
    killed.add(current.child.pid as number);
    current = await options.start();
  }
  return { survivor: current, killed };
}

/** One run of a step's function, as its effect shows it: the key, the id the run wrote, the process. */
export interface StepEffect {
  key: string;
  id: string;
  pid: number;
}

/**
 * Checks the effects of one step (in the order they happened) against the final answers (`answers`: the id each
 * key's answer carries for this step). A recorded step never runs again, so the answer's id is the key's last
 * effect, and every earlier run belongs to a process killed between the effect and its record. Returns the
 * problems found and how many runs were repeated (after a kill).
 */
export function checkStepEffects(
  step: string,
  effects: readonly StepEffect[],
  answers: ReadonlyMap<string, string>,
  killed: ReadonlySet<number>,
): { problems: string[]; reruns: number } {
  const byKey = new Map<string, StepEffect[]>();
  for (const effect of effects) {
    const list = byKey.get(effect.key) ?? [];
    list.push(effect);
    byKey.set(effect.key, list);
  }
  const problems: string[] = [];
  let reruns = 0;
  for (const [key, id] of answers) {
    const list = byKey.get(key) ?? [];
    const last = list[list.length - 1];
    if (last === undefined) {
      problems.push(`${step} ${key}: no effect, yet the answer carries ${id}`);
      continue;
    }
    if (last.id !== id)
      problems.push(`${step} ${key}: the answer carries ${id}, the last run wrote ${last.id}`);
    for (const earlier of list.slice(0, -1)) {
      reruns++;
      if (!killed.has(earlier.pid))
        problems.push(`${step} ${key}: ran again after a run by ${earlier.pid}, which was never killed`);
    }
  }
  for (const key of byKey.keys())
    if (!answers.has(key)) problems.push(`${step} ${key}: an effect, no answer`);
  return { problems, reruns };
}

/**
 * Checks the provider: each order was charged under one Idempotency-Key, `keyFor('charge')` of its store key, and
 * its answer carries that charge's id; every call but the last came from a killed process.
 */
export function checkCharges(
  provider: ChargeProvider,
  answers: ReadonlyMap<string, string>,
  storeKeyOf: (key: string) => string,
  killed: ReadonlySet<number>,
): { problems: string[]; repeatedCalls: number } {
  const problems: string[] = [];
  const executed = new Map<string, string[]>();
  for (const [idempotencyKey, { order }] of provider.charges) {
    executed.set(order, [...(executed.get(order) ?? []), idempotencyKey]);
  }
  const calls = new Map<string, ProviderCall[]>();
  for (const call of provider.calls) calls.set(call.order, [...(calls.get(call.order) ?? []), call]);
  let repeatedCalls = 0;
  for (const [key, chargeId] of answers) {
    const keys = executed.get(key) ?? [];
    if (keys.length !== 1) {
      problems.push(`charge ${key}: executed ${keys.length} times`);
      continue;
    }
    const idempotencyKey = keys[0] as string;
    if (idempotencyKey !== expectedKeyFor(storeKeyOf(key), 'charge'))
      problems.push(`charge ${key}: Idempotency-Key ${idempotencyKey} is not keyFor('charge')`);
    const charged = provider.charges.get(idempotencyKey)?.chargeId;
    if (charged !== chargeId)
      problems.push(`charge ${key}: the answer carries ${chargeId}, the charge is ${charged}`);
    for (const call of (calls.get(key) ?? []).slice(0, -1)) {
      repeatedCalls++;
      if (!killed.has(call.pid))
        problems.push(`charge ${key}: called again after a call by ${call.pid}, which was never killed`);
    }
  }
  for (const order of executed.keys()) if (!answers.has(order)) problems.push(`charge ${order}: no answer`);
  return { problems, repeatedCalls };
}

/**
 * One line of the journal an app or worker keeps, in one order across processes: `fn` as a step's function starts,
 * `returned` (with the value) once `step()` resolved, `hook:run` / `hook:replayed` as `onStep` reports it.
 */
export interface JournalEntry {
  key: string;
  step: string;
  what: 'fn' | 'returned' | 'hook:run' | 'hook:replayed';
  value: string;
  pid: number;
}

/**
 * Checks the journal against the answers (each key's value per step). Once `step()` resolved for a key and step
 * (the value was recorded, or replayed), its function never starts again; every attempt that got past the step
 * got the answer's value; `onStep` reported at most one run per key and step (a kill may lose an entry, never add
 * one); and a function started again only after a kill of the process that started it before. Returns the
 * problems, how many functions started again, and how many steps were replayed.
 */
export function checkJournal(
  entries: readonly JournalEntry[],
  answers: ReadonlyMap<string, Readonly<Record<string, string>>>,
  killed: ReadonlySet<number>,
): { problems: string[]; reruns: number; replays: number } {
  const problems: string[] = [];
  const fns = new Map<string, number[]>();
  const hookRuns = new Map<string, number>();
  const returned = new Set<string>();
  let reruns = 0;
  let replays = 0;
  for (const entry of entries) {
    const id = `${entry.key} ${entry.step}`;
    const answer = answers.get(entry.key)?.[entry.step];
    if (answer === undefined) {
      problems.push(`${id}: journaled (${entry.what}), not in any answer`);
      continue;
    }
    if (entry.what === 'fn') {
      if (returned.has(id)) problems.push(`${id}: ran in ${entry.pid} after step() had resolved`);
      const pids = fns.get(id) ?? [];
      const before = pids[pids.length - 1];
      if (before !== undefined) {
        reruns++;
        if (!killed.has(before))
          problems.push(`${id}: ran in ${entry.pid} after ${before}, which was never killed`);
      }
      fns.set(id, [...pids, entry.pid]);
    } else if (entry.what === 'returned') {
      returned.add(id);
      if (entry.value !== answer)
        problems.push(`${id}: resolved to ${entry.value} in ${entry.pid}, answered ${answer}`);
    } else if (entry.what === 'hook:run') {
      hookRuns.set(id, (hookRuns.get(id) ?? 0) + 1);
      if (hookRuns.get(id) === 2) problems.push(`${id}: onStep reported two runs`);
    } else {
      replays++;
    }
  }
  for (const [key, steps] of answers) {
    for (const step of Object.keys(steps)) {
      if (!fns.has(`${key} ${step}`)) problems.push(`${key} ${step}: answered, but its function never ran`);
    }
  }
  return { problems, reruns, replays };
}

/** What a key's answer (an HTTP response body, a job's return value) carries: the id each step gave. */
export interface CrashAnswer {
  orderId: string;
  chargeId: string;
  emailId: string;
}

/**
 * All the checks of a crash run at once: the order and outbox effects, the provider's charges (keyed by
 * `keyFor('charge')` of the key itself) and the journal. Returns the problems, at most `shown` of them (jest's
 * diff of a long array takes minutes), their count, and a summary for the log.
 */
export function checkCrashRun(run: {
  answers: ReadonlyMap<string, CrashAnswer>;
  orders: readonly StepEffect[];
  outbox: readonly StepEffect[];
  journal: readonly JournalEntry[];
  provider: ChargeProvider;
  killed: ReadonlySet<number>;
}): { problems: number; first: string[]; replays: number; summary: string } {
  const idsOf = (pick: (a: CrashAnswer) => string) =>
    new Map([...run.answers].map(([key, answer]) => [key, pick(answer)]));
  const orders = checkStepEffects(
    'order',
    run.orders,
    idsOf((a) => a.orderId),
    run.killed,
  );
  const emails = checkStepEffects(
    'email',
    run.outbox,
    idsOf((a) => a.emailId),
    run.killed,
  );
  const charges = checkCharges(
    run.provider,
    idsOf((a) => a.chargeId),
    (key) => key,
    run.killed,
  );
  const steps = new Map(
    [...run.answers].map(([key, a]) => [key, { order: a.orderId, charge: a.chargeId, email: a.emailId }]),
  );
  const journal = checkJournal(run.journal, steps, run.killed);
  const problems = [...orders.problems, ...charges.problems, ...emails.problems, ...journal.problems];
  return {
    problems: problems.length,
    first: problems.slice(0, 10),
    replays: journal.replays,
    summary: `${run.killed.size} kills; steps replayed ${journal.replays}; step functions run again after a kill ${journal.reruns} (provider calls repeated ${charges.repeatedCalls})`,
  };
}
