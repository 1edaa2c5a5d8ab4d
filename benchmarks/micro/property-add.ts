// Why @oncely/express adds no property to a covered request or response: Express replaces the prototype of every
// `req` and `res` (`Object.setPrototypeOf(res, app.response)`), and V8 caches no transitions for an object whose
// prototype was replaced, so each property added to one afterwards builds a new hidden class. This measures a
// ServerResponse built as Node builds it, with and without that prototype change, then with properties added.
// `pnpm --filter @oncely/benchmarks micro:props`
import http from 'node:http';
import { Socket } from 'node:net';

const appResponse = Object.create(Object.create(http.ServerResponse.prototype)) as object;
const request = new http.IncomingMessage(new Socket());

function measure(name: string, work: (res: http.ServerResponse & Record<string, unknown>) => void): void {
  const make = () => new http.ServerResponse(request) as http.ServerResponse & Record<string, unknown>;
  for (let i = 0; i < 20_000; i++) work(make());
  let best = Number.POSITIVE_INFINITY;
  for (let round = 0; round < 5; round++) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < 20_000; i++) work(make());
    best = Math.min(best, Number(process.hrtime.bigint() - start) / 20_000);
  }
  console.log(`${name.padEnd(46)} ${best.toFixed(0).padStart(6)} ns`);
}

measure('new ServerResponse', () => {});
measure('  + 3 properties added', (res) => {
  res.a = 1;
  res.b = 2;
  res.c = 3;
});
measure('  + setPrototypeOf (what Express does)', (res) => {
  Object.setPrototypeOf(res, appResponse);
});
measure('  + setPrototypeOf, then 1 property added', (res) => {
  Object.setPrototypeOf(res, appResponse);
  res.a = 1;
});
measure('  + setPrototypeOf, then 3 properties added', (res) => {
  Object.setPrototypeOf(res, appResponse);
  res.a = 1;
  res.b = 2;
  res.c = 3;
});
const states = new WeakMap<object, number>();
measure('  + setPrototypeOf, then a WeakMap entry', (res) => {
  Object.setPrototypeOf(res, appResponse);
  states.set(res, 1);
});
