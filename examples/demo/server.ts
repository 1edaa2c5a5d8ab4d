import { randomUUID } from 'node:crypto';
import { createApp, FAIL_HEADER } from './app';

const host = '127.0.0.1';
const port = Number(process.env.PORT ?? 3000);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`PORT must be a port number; got ${JSON.stringify(process.env.PORT)}`);
  process.exit(1);
}

const SLOW_CHARGE_MS = 5000;
const server = createApp({ slowChargeMs: SLOW_CHARGE_MS }).listen(port, host);

server.on('error', (error: NodeJS.ErrnoException) => {
  console.error(
    error.code === 'EADDRINUSE'
      ? `Port ${port} is in use. Run with another port: PORT=3001 npm start`
      : `Could not start the demo: ${error.message}`,
  );
  process.exit(1);
});

server.on('listening', () => {
  const address = server.address();
  const url = `http://${host}:${typeof address === 'object' && address !== null ? address.port : port}`;
  // Fresh keys on every start: the memory store forgets everything when the process stops.
  const key = `demo-${randomUUID()}`;
  const slowKey = `demo-${randomUUID()}`;
  const orderKey = `demo-${randomUUID()}`;
  const orderKey2 = `demo-${randomUUID()}`;
  const post = (path: string, k: string, body: string) =>
    `curl -i -w '\\n' -X POST ${url}${path} -H 'Idempotency-Key: ${k}' -H 'Content-Type: application/json' -d '${body}'`;
  const body = '{"amount":1000,"currency":"eur"}';
  const slowBody = '{"amount":500,"currency":"eur"}';
  const orderBody = '{"amount":1500,"currency":"eur","email":"ada@example.com"}';

  console.log(`oncely demo listening on ${url} (Express 5, in-memory store). Ctrl+C to stop.
This terminal logs what the server does; run the commands below in another terminal, in order.

1. First call: the handler runs and answers 201 Created with a new charge.

   ${post('/charges', key, body)}

2. The same call again, as a client retrying would: the stored 201 comes back, the same body byte for byte,
   plus the header "Idempotent-Replayed: true". The handler does not run: no new "charge ... created" line here.

   ${post('/charges', key, body)}

3. A duplicate sent while the first request still runs. POST /slow-charges takes ${SLOW_CHARGE_MS / 1000} s. This line
   sends one request in the background (&) and the same one again a second later: that second one gets
   409 Conflict at once, with a Retry-After header and a problem+json body of type request-in-progress.
   A few seconds later the first prints its 201. Send the same request once more afterwards: it is replayed.

   ${post('/slow-charges', slowKey, slowBody)} & sleep 1; ${post('/slow-charges', slowKey, slowBody)}; wait

4. The key of step 1 with a different body: 422 Unprocessable Entity, a problem+json body of type key-reused.
   The stored charge is left as it was: step 2 still replays it.

   ${post('/charges', key, '{"amount":9999,"currency":"eur"}')}

5. An invalid key (a space is not allowed in a key): 400 Bad Request, problem+json of type key-invalid.

   ${post('/charges', 'not a valid key', body)}

Without an Idempotency-Key header the middleware stays out of the way: every call creates a new charge.

   curl -i -w '\\n' -X POST ${url}/charges -H 'Content-Type: application/json' -d '${body}'

6. Steps (docs/steps.md): POST /orders writes an order, charges through the demo's own payment provider
   (POST /provider/charges, which deduplicates by Idempotency-Key as real providers do; the route passes it
   keyFor('charge')), then queues an email. This call fails on purpose after the charge, before the email
   (header ${FAIL_HEADER}: after-charge): 500, and the key is released with its two steps recorded.

   ${post('/orders', orderKey, orderBody)} -H '${FAIL_HEADER}: after-charge'

   The client retries with the same key: the order and the charge are replayed from the record (the provider is
   not called: no "provider:" line here), the email step runs, and the 201 carries the charge id of the first call.

   ${post('/orders', orderKey, orderBody)}

   What the provider did: one charge for the key ("charges": 1), asked for once ("requests": 1).

   curl -s -w '\n' ${url}/provider/charges

   The one window a record cannot cover: the provider charged, and the process failed before the step was
   recorded. The retry runs the charge step again, with the same keyFor('charge'): the provider answers the charge
   it made ("requests": 2, "charges": 1), and the 201 carries its id.

   ${post('/orders', orderKey2, orderBody)} -H '${FAIL_HEADER}: charge-not-recorded'
   ${post('/orders', orderKey2, orderBody)}
   curl -s -w '\n' ${url}/provider/charges

7. The decisions so far, counted by @oncely/opentelemetry (OpenTelemetry metrics, Prometheus text format):
   oncely_decisions_total by outcome (executed, replayed, conflict, mismatch, rejected...), store operation
   durations, executions in flight, oncely_steps_total by outcome (run, replayed). See docs/observability.md.

   curl -s ${url}/metrics | grep '^oncely_'
`);
});

const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
