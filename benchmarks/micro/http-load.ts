// The load of one turn of micro/http.ts, in a process of its own so that the measured process holds only the
// servers: autocannon, 50 connections, `POST /charges` with the benchmark's body and a key per request (first
// execution) or one of 100 (replay). Prints the requests answered, as JSON.
// `node --import tsx micro/http-load.ts <port> <seconds> <first|replay>`
import autocannon from 'autocannon';
import { PATH, REQUEST_BODY } from '../src/route';

const [port, seconds, scenario] = process.argv.slice(2);
let n = 0;
const result = await autocannon({
  url: `http://127.0.0.1:${port}${PATH}`,
  connections: 50,
  duration: Number(seconds),
  requests: [
    {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: REQUEST_BODY,
      setupRequest: (request) => ({
        ...request,
        headers: {
          ...request.headers,
          'idempotency-key': scenario === 'replay' ? `warm-${n++ % 100}` : `k${process.pid}-${n++}`,
        },
      }),
    },
  ],
});
// 409s apart: a replay run's warm-up gets them (micro/http.ts allows those, and nothing else, there).
const conflicts =
  (result.statusCodeStats as Record<string, { count: number }> | undefined)?.['409']?.count ?? 0;
console.log(JSON.stringify({ answered: result.requests.total, non2xx: result.non2xx, conflicts }));
