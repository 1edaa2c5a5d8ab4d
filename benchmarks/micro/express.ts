// What oncely's Express adapter costs per request over real sockets: bare Express and oncely + Memory in one
// process, loaded in turns by autocannon in a child process (micro/http-load.ts), CPU time (user + system) of this
// process per request read around each turn. One process and alternating turns: the JIT, the heap and the
// machine's drift are the same for both, so differences of ~10 µs show, which the runner's ±30% between runs
// hides. Express needs real sockets here: light-my-request's objects do not take the prototypes Node's do, and
// what costs most on Express (properties added after its `setPrototypeOf`) does not show through them.
// `node --conditions=@oncely/source --import tsx micro/express.ts [first|replay]` in benchmarks/ (on the sources).
import { execFile } from 'node:child_process';
import type { AddressInfo } from 'node:net';
import { MemoryStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import { type ChargeRequest, charge, PATH } from '../src/route';

const scenario = process.argv[2] === 'replay' ? 'replay' : 'first';
const turns = Number(process.env.TURNS ?? 6);
const seconds = Number(process.env.SECONDS ?? 3);

function listen(covered: boolean): Promise<number> {
  const app = express();
  app.use(express.json());
  if (covered) app.use(idempotency({ store: new MemoryStore() }));
  app.post(PATH, (req, res) => void res.status(201).json(charge(req.body as ChargeRequest)));
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port));
  });
}

function load(port: number, duration: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const args = ['--import', 'tsx', 'micro/http-load.ts', String(port), String(duration), scenario];
    execFile(process.execPath, args, (error, stdout) => {
      if (error) return reject(error);
      const { answered, non2xx } = JSON.parse(stdout) as { answered: number; non2xx: number };
      if (non2xx > 0) return reject(new Error(`${non2xx} answers were not 2xx`));
      resolve(answered);
    });
  });
}

const ports = { bare: await listen(false), oncely: await listen(true) };
const names = Object.keys(ports) as (keyof typeof ports)[];
// Warm-up: the JIT, and MemoryStore's LRU filling up, as under load.
for (const name of names) await load(ports[name], 2);
const cpu: Record<keyof typeof ports, number[]> = { bare: [], oncely: [] };
for (let t = 0; t < turns; t++) {
  // Alternate the order every turn, so neither always follows the other.
  for (let i = 0; i < names.length; i++) {
    const name = names[(i + t) % names.length] as keyof typeof ports;
    const before = process.cpuUsage();
    const answered = await load(ports[name], seconds);
    const used = process.cpuUsage(before);
    cpu[name].push((used.user + used.system) / answered);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1] as number;
console.log(`Express over HTTP, ${scenario}, ${turns} turns of ${seconds} s: server CPU µs per request`);
for (const name of names) {
  const m = median(cpu[name]);
  const all = cpu[name].map((x) => x.toFixed(0)).join(' ');
  console.log(
    `${name.padEnd(7)} median ${m.toFixed(1)}  turns ${all}  (+${(m - median(cpu.bare)).toFixed(1)} over bare)`,
  );
}
process.exit(0);
