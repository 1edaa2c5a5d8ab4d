// docs/benchmarks.md and docs/benchmarks.svg from one run's results. The hand-written analysis of the last
// published run lives in benchmarks/notes.md and is included as it is.
import { existsSync, readFileSync } from 'node:fs';
import { FRAMEWORK_LABEL, type Scenario } from './http';
import { lambdaSection } from './lambda';
import type { ProfileSummary } from './profile';
import {
  type CaseResult,
  evaluateTargets,
  findCase,
  fmtTrips,
  type RunResults,
  ratioToBare,
} from './results';

const SCENARIO_LABEL: Record<Scenario, string> = {
  bare: 'no middleware',
  first: 'first execution',
  replay: 'replay',
  nokey: 'no key',
};

const int = (n: number) => Math.round(n).toLocaleString('en-US');
const ms = (n: number) => (n < 10 ? n.toFixed(2) : n.toFixed(1));
const pct = (n: number) => `${(n * 100).toFixed(1)}%`;
const us = (n: number | undefined) => (n === undefined ? '' : n.toFixed(1));

function table(head: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(head), line(head.map(() => '---')), ...rows.map(line)].join('\n');
}

function httpRows(results: RunResults, cases: CaseResult[], withOncely = false): string[][] {
  return cases.map((r) => {
    const ratio = ratioToBare(results, r);
    const row = [
      r.case.subject,
      SCENARIO_LABEL[r.case.scenario],
      int(r.median.rps),
      ms(r.median.p50),
      ms(r.median.p99),
      us(r.median.cpuServerUs),
      us(r.median.cpuStoreUs),
      int(r.median.non2xx + r.median.errors),
      ratio === undefined ? '' : `${ratio.toFixed(2)}×`,
    ];
    if (withOncely) {
      const store = r.case.kind.impl === 'bare' ? undefined : (r.case.kind as { store?: string }).store;
      const ours =
        store === undefined || store === 'none' || r.case.scenario === 'bare'
          ? undefined
          : // @node-idempotency/nestjs against oncely on the same Nest app (when measured), the others against Express.
            ((r.case.kind.impl === 'nest'
              ? findCase(results, `nest/oncely-${store}/${r.case.scenario}`)
              : undefined) ?? findCase(results, `express/oncely-${store}/${r.case.scenario}`));
      row.push(ours === undefined ? '' : `${(ours.median.rps / r.median.rps).toFixed(2)}×`);
    }
    return row;
  });
}

const HTTP_HEAD = [
  'server',
  'scenario',
  'requests/s',
  'p50 ms',
  'p99 ms',
  'server CPU µs/req',
  'store CPU µs/req',
  'non-2xx',
  '× bare',
];

function profileSection(summary: ProfileSummary, title: string): string {
  const busy = summary.totalMs - summary.idleMs;
  return [
    `${title}: ${int(summary.totalMs)} ms sampled, ${int(summary.idleMs)} ms idle (${pct(summary.idleMs / summary.totalMs)}); shares below are of the ${int(busy)} ms on CPU.`,
    '',
    table(
      ['area', 'self time', 'share'],
      summary.areas.slice(0, 8).map((a) => [a.area, `${int(a.selfMs)} ms`, pct(a.share)]),
    ),
    '',
    table(
      ['function', 'where', 'area', 'self', 'share'],
      summary.top
        .slice(0, 12)
        .map((f) => [
          `\`${f.name}\``,
          f.where === '' ? '' : `\`${f.where}\``,
          f.area,
          `${int(f.selfMs)} ms`,
          pct(f.share),
        ]),
    ),
  ].join('\n');
}

export function renderMarkdown(results: RunResults, svgName: string, notesPath: string): string {
  const o = results.options;
  const m = results.machine;
  const groups = {
    express: results.http.filter((r) => r.case.group === 'express'),
    fastify: results.http.filter((r) => r.case.group === 'fastify'),
    hono: results.http.filter((r) => r.case.group === 'hono'),
    koa: results.http.filter((r) => r.case.group === 'koa'),
    nest: results.http.filter((r) => r.case.group === 'nest'),
    peers: results.http.filter((r) => r.case.group === 'peers'),
  };
  const targets = evaluateTargets(results);
  const out: string[] = [];
  out.push('# Benchmarks');
  out.push('');
  out.push(
    `What oncely costs over the bare framework, how it compares with the idempotency libraries on npm, and what each store does per request. Every number below comes from one run of \`${results.command}\` on ${results.date.slice(0, 10)} (${Math.round(results.elapsedSec / 60)} min${results.commit === undefined ? '' : `, packages built from commit \`${results.commit}\``}); the page and the chart are written by that command. Run \`pnpm bench\` for the same measurements without touching the docs, \`pnpm bench --help\` for the flags.`,
  );
  out.push('');
  out.push('## Machine');
  out.push('');
  out.push(
    table(
      ['', ''],
      [
        ['CPU', `${m.cpu}, ${m.cores} cores`],
        ['memory', `${m.memoryGiB} GiB`],
        ['OS', m.os],
        ['Node', m.node],
        ['Redis', m.redis],
        ['PostgreSQL', m.postgres],
        ['MySQL', m.mysql ?? 'not measured'],
        ['load average before the run (1/5/15 min)', m.loadBefore],
      ],
    ),
  );
  out.push('');
  out.push(
    `**The load generator shares the ${m.cores} cores with the server** (and with Redis or PostgreSQL when the store is one of them): autocannon runs in the runner process, the server in a child process of its own, all on 127.0.0.1. A faster server also leaves less CPU to the load generator, so the ratios to the bare framework understate what a server on a machine of its own would show in absolute requests/s, and a store that needs its own CPU (Redis, PostgreSQL) competes with both. Compare numbers within this page only.`,
  );
  out.push('');
  out.push('## How it is measured');
  out.push('');
  out.push(
    [
      `- Each case is a server started in its own Node process (\`node --import tsx src/server.ts\` in \`benchmarks/\`, loading the packages' **built \`dist/\`**, which is what users run; \`pnpm bench\` builds them first), listening on 127.0.0.1 port 0.`,
      `- Load: autocannon (programmatic, in the runner process), ${o.connections} connections, no pipelining, ${o.warmup} s of warm-up load (not counted) and then ${o.duration} s measured per case, ${o.rounds} round${o.rounds === 1 ? '' : 's'}; each table shows the **median** of the rounds. Within a round the cases of Express, Fastify and the peers alternate, and every other round runs in reverse order, so drift on the machine spreads over all cases.`,
      `- The route: \`POST /charges\` with a 103-byte JSON body, answered \`201\` with the same ~110 bytes of JSON by every server. Body parsing is on (\`express.json()\`, Fastify's own parser), since the default fingerprint hashes the body.`,
      `- Scenarios: **no middleware** (the bare framework, sent the same requests as *first execution*); **first execution** (a new \`Idempotency-Key\` on every request, set by autocannon's \`setupRequest\`); **replay** (${o.replayKeys} keys, each stored once before the measurement, then requested over and over); **no key** (the covered route, requests without a key). Every scenario builds its requests through the same \`setupRequest\`, so the load generator does the same work in each.`,
      '- **CPU µs/req**: user + system CPU time of the server process (all its threads), and of the store server (`redis-server`; the PostgreSQL postmaster and all its children) when it runs on this machine, read from `/proc` just before and just after the measured window and divided by the requests answered in it. Requests/s on this shared machine move by ±30% between runs; the CPU a request costs moves much less, so targets read it beside requests/s. The store figure counts every client of that server in the window (the benchmark is its only busy one).',
      "- **floor (by hand) + Redis** (Express and Fastify, `src/floor.ts`): the least work any atomic Redis-backed idempotency layer must do, written by hand in the route over one ioredis client with auto-pipelining: one script call that returns the stored record or reserves the key (`SET ... PX`), the handler, one `SET ... PX` of status, headers and body before the response is sent. No fingerprint, no fencing token, no lease renewal, no wait mode, no problem+json. It is the reference for what oncely's Redis path can cost: the CPU targets compare oncely + Redis with it.",
      `- **× bare** is the case's median requests/s over the median of the bare framework in the same run (Express cases and express-idempotency over bare Express 5, Fastify over bare Fastify, @node-idempotency/nestjs over a bare NestJS app).`,
      '- Stores as a user would set them up: `MemoryStore` defaults; `RedisStore` over one ioredis client; `PostgresStore` over a `pg` Pool of the default size (10); `MySQLStore` over a `mysql2` pool of 10 wrapped in `withQueryTimeout`, as docs/stores/mysql.md shows. Redis keys get a random prefix per run, PostgreSQL a schema and MySQL a table of their own per run, all removed at the end.',
    ].join('\n'),
  );
  out.push('');
  out.push(`![requests/s per scenario](${svgName})`);
  out.push('');
  out.push('## Targets');
  out.push('');
  out.push(
    table(
      ['target', 'wanted', 'measured', ''],
      targets.map((t) => [
        t.name,
        t.want,
        t.measured,
        t.met === undefined ? 'not measured' : t.met ? 'met' : '**not met**',
      ]),
    ),
  );
  out.push('');
  const unmet = targets.filter((t) => t.met === false);
  if (unmet.length > 0)
    out.push(
      `${unmet.length} target${unmet.length === 1 ? ' is' : 's are'} not met in this run: see [why](#where-the-time-goes) below, with the profiles.`,
    );
  else out.push('Every target is met in this run.');
  out.push('');
  for (const [group, title] of [
    ['express', 'Express 5'],
    ['fastify', 'Fastify 5'],
    ['hono', 'Hono 4 (@hono/node-server)'],
    ['koa', 'Koa 3 (@koa/bodyparser)'],
    ['nest', 'NestJS 11 (@nestjs/platform-express)'],
  ] as const) {
    if (groups[group].length === 0) continue;
    out.push(`## HTTP: ${title}`);
    out.push('');
    out.push(table(HTTP_HEAD, httpRows(results, groups[group])));
    out.push('');
  }
  if (groups.peers.length > 0) {
    out.push('## HTTP: the npm peers');
    out.push('');
    out.push(
      'Each peer is installed from npm as a dev dependency of `benchmarks/` and used as its README says, on the same route. **oncely ÷ this** is oncely on Express with the same store and scenario over this row (above 1: oncely serves more requests/s).',
    );
    out.push('');
    out.push(
      [
        "- `express-idempotency` 1.0.6 on Express 5.3: `app.use(idempotency({ dataAdapter }))` and `getSharedIdempotencyService().isHit(req)` in the handler (the middleware calls `next()` after a replay too); memory is its default in-memory adapter, Redis is `express-idempotency-redis-adapter` 1.0.8 (node-redis v4), as the adapter's README shows. Its replay sends no replay marker; it looks a record up, then creates it (two commands, not atomic), and stores the response after sending it, without waiting.",
        "- `@node-idempotency/nestjs` 1.0.4 on NestJS 11.2 with `@nestjs/platform-express` (Express 5 inside Nest; its declared peer range stops at NestJS 10, and it runs unchanged on 11): `NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' | 'redis', options } })` and `@Idempotent()` on the handler; Redis is its `redis` (node-redis v4) adapter. Compared with a bare NestJS app, since Nest itself costs a lot over plain Express.",
      ].join('\n'),
    );
    out.push('');
    out.push(table([...HTTP_HEAD, 'oncely ÷ this'], httpRows(results, groups.peers, true)));
    out.push('');
  }
  if (results.stores.length > 0) {
    out.push('## Stores alone');
    out.push('');
    out.push(
      `In-process, one fresh process per store, ${o.microConcurrency} operations in flight, ${o.microDuration} s per phase after a warm-up. *acquire + complete* is a first execution's store work (a new key); *replay* is \`acquire\` on one of 100 completed keys. Round trips are **counted** over ${o.countOps} operations run one at a time: Redis commands seen by \`MONITOR\` on the key (commands a Lua script runs inside Redis are not round trips and are not counted), PostgreSQL queries through a wrapped \`pool.query\`, MySQL statements through a wrapped \`pool.execute\` and \`pool.query\`.`,
    );
    out.push('');
    out.push(
      table(
        [
          'store',
          'acquire + complete /s',
          'replay /s',
          'round trips: first execution',
          'round trips: replay',
          'counted by',
        ],
        results.stores.map((s) => [
          s.store,
          int(s.acquireComplete),
          int(s.replay),
          s.tripsFirst === null ? 'none (in-process)' : fmtTrips(s.tripsFirst),
          s.tripsReplay === null ? 'none (in-process)' : fmtTrips(s.tripsReplay),
          s.counter,
        ]),
      ),
    );
    out.push('');
  }
  const pgStore = results.stores.find((s) => s.store === 'postgres');
  if (pgStore?.walBytesFirst !== undefined && pgStore.walBytesReplay !== undefined) {
    out.push(
      `PostgreSQL wrote ${int(pgStore.walBytesFirst)} bytes of WAL per first execution and ${int(pgStore.walBytesReplay)} per replay in the counted phases (\`pg_current_wal_insert_lsn()\` before and after; other clients of the server would add to it).`,
    );
    out.push('');
  }
  if (results.httpTrips.length > 0) {
    out.push('## Redis round trips per HTTP request');
    out.push('');
    out.push(
      `Counted with \`MONITOR\` (${results.tripsCounter}) while ${o.countOps} requests run one after another through each server: every command from the server that names one of the run's keys, script-internal commands excluded.`,
    );
    out.push('');
    out.push(
      table(
        ['server', 'first execution', 'replay'],
        results.httpTrips.map((t) => [t.subject, fmtTrips(t.first), fmtTrips(t.replay)]),
      ),
    );
    out.push('');
  }
  if (results.memory !== null) {
    const mem = results.memory;
    out.push('## Memory per stored record');
    out.push('');
    out.push(
      `\`benchmarks/memory-per-record.ts\`, ${int(mem.records)} completed records, each a 100-byte body with three headers (content-type, etag, x-powered-by), UUID keys and SHA-256 fingerprints.`,
    );
    out.push('');
    out.push(
      table(
        ['store', 'bytes per record', 'how'],
        [
          [
            'MemoryStore',
            int(mem.memoryStore),
            'V8 heap + array buffers after GC, before and after (each body is a copy; up to 1 KiB, in shared 8 KiB slabs)',
          ],
          [
            'RedisStore',
            int(mem.redisStore),
            `Redis \`used_memory\` before and after (\`MEMORY USAGE\` of one record: ${mem.redisMemoryUsage}, encoding ${mem.redisEncoding})`,
          ],
        ],
      ),
    );
    out.push('');
  }
  if (results.lambda != null) out.push(...lambdaSection(results.lambda), '');
  out.push('## Where the time goes');
  out.push('');
  if (results.profiles.length > 0) {
    out.push(
      `For each target not met, the server of that case was run again under the same load with \`node --cpu-prof\` and the profile summarised by self time (\`benchmarks/src/profile.ts\`; the \`.cpuprofile\` files stay out of git). The bare framework under the same load is profiled too, for comparison.`,
    );
    out.push('');
    const shown = new Set<string>();
    for (const p of results.profiles) {
      out.push(`### ${p.caseId} (${p.target})`);
      out.push('');
      out.push(profileSection(p.summary, `\`${p.caseId}\``));
      out.push('');
      if (p.baseline !== undefined) {
        const base = p.baseline.file.replace(/^.*\//, '');
        if (shown.has(base)) out.push(`Its bare framework's profile is shown above (\`${base}\`).`);
        else out.push(profileSection(p.baseline, `Its bare framework under the same load (\`${base}\`)`));
        shown.add(base);
        out.push('');
      }
    }
  } else {
    out.push('No target was missed in this run, so no profile was taken.');
    out.push('');
  }
  if (existsSync(notesPath)) {
    out.push(readFileSync(notesPath, 'utf8').trim());
    out.push('');
  }
  if (results.notes.length > 0) {
    out.push('## Left out of this run');
    out.push('');
    out.push(results.notes.map((n) => `- ${n}`).join('\n'));
    out.push('');
  }
  out.push('## Running it');
  out.push('');
  out.push(
    [
      '```sh',
      'pnpm bench                       # the whole matrix: 10 s per case, 3 rounds (builds the packages first)',
      'pnpm bench --framework fastify --store memory,redis --scenario first,replay --duration 5',
      'pnpm bench --smoke               # 1 s per case, 1 round: checks the harness (CI runs it), asserts nothing about speed',
      'pnpm bench --report              # also writes docs/benchmarks.md and docs/benchmarks.svg, profiling missed targets',
      '```',
      '',
      'Redis is `REDIS_URL` (default `redis://127.0.0.1:6379`), PostgreSQL `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and MySQL `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); round trips and memory per record use a private `redis-server` when the binary is installed. Raw results of the last run are in `benchmarks/results/latest.json` (not committed).',
    ].join('\n'),
  );
  out.push('');
  return out.join('\n');
}

// ---- the chart ---------------------------------------------------------------------------------------------

const COLORS: Record<Scenario, string> = {
  bare: '#8c8c8c',
  first: '#2f6fb3',
  replay: '#3a9a5b',
  nokey: '#d08a2e',
};

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** A horizontal grouped bar chart: one group per server configuration, one bar per scenario. */
export function renderSvg(results: RunResults): string {
  const o = results.options;
  interface Group {
    label: string;
    bars: { scenario: Scenario; rps: number }[];
  }
  const groups: Group[] = [];
  const seen = new Map<string, Group>();
  const order = ['express', 'fastify', 'hono', 'koa', 'nest', 'peers'];
  const sorted = [...results.http].sort((a, b) => order.indexOf(a.case.group) - order.indexOf(b.case.group));
  for (const r of sorted) {
    const framework = r.case.group === 'peers' ? '' : FRAMEWORK_LABEL[r.case.group];
    const label =
      r.case.scenario === 'bare'
        ? `${r.case.subject.replace(/^bare /, '')} (bare)`
        : framework === ''
          ? r.case.subject
          : `${framework}: ${r.case.subject}`;
    let group = seen.get(label);
    if (group === undefined) {
      group = { label, bars: [] };
      seen.set(label, group);
      groups.push(group);
    }
    group.bars.push({ scenario: r.case.scenario, rps: r.median.rps });
  }
  const max = Math.max(1, ...groups.flatMap((g) => g.bars.map((b) => b.rps)));
  const step = niceStep(max / 5);
  const axisMax = Math.ceil(max / step) * step;
  const labelWidth = 300;
  const plotWidth = 560;
  const barHeight = 11;
  const groupGap = 12;
  const top = 80;
  const left = labelWidth + 10;
  let y = top;
  const parts: string[] = [];
  for (const g of groups) {
    const height = g.bars.length * barHeight;
    parts.push(
      `<text x="${labelWidth}" y="${(y + height / 2 + 4).toFixed(1)}" text-anchor="end" class="label">${esc(g.label)}</text>`,
    );
    for (const b of g.bars) {
      const w = (b.rps / axisMax) * plotWidth;
      parts.push(
        `<rect x="${left}" y="${y}" width="${w.toFixed(1)}" height="${barHeight - 2}" fill="${COLORS[b.scenario]}"><title>${esc(g.label)}, ${SCENARIO_LABEL[b.scenario]}: ${int(b.rps)} requests/s</title></rect>`,
      );
      parts.push(
        `<text x="${(left + w + 4).toFixed(1)}" y="${y + barHeight - 3}" class="value">${int(b.rps)}</text>`,
      );
      y += barHeight;
    }
    y += groupGap;
  }
  const bottom = y;
  const grid: string[] = [];
  for (let v = 0; v <= axisMax + 1e-9; v += step) {
    const x = left + (v / axisMax) * plotWidth;
    grid.push(
      `<line x1="${x.toFixed(1)}" y1="${top - 6}" x2="${x.toFixed(1)}" y2="${bottom - groupGap + 4}" class="grid"/>`,
    );
    grid.push(
      `<text x="${x.toFixed(1)}" y="${bottom - groupGap + 18}" text-anchor="middle" class="axis">${int(v)}</text>`,
    );
  }
  const width = left + plotWidth + 70;
  const height = bottom + 30;
  const legend = (['bare', 'first', 'replay', 'nokey'] as const).map((s, i) => {
    const x = left + i * 140;
    return `<rect x="${x}" y="50" width="12" height="12" fill="${COLORS[s]}"/><text x="${x + 18}" y="60" class="legend">${SCENARIO_LABEL[s]}</text>`;
  });
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="Helvetica, Arial, sans-serif">`,
    '<title>oncely benchmarks: requests per second per scenario</title>',
    '<style>.label{font-size:12px;fill:#222}.value{font-size:10px;fill:#444}.axis{font-size:10px;fill:#666}.legend{font-size:12px;fill:#222}.grid{stroke:#e3e3e3;stroke-width:1}.title{font-size:15px;font-weight:bold;fill:#111}</style>',
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="12" y="22" class="title">${esc(`Requests/s per scenario, median of ${o.rounds} round${o.rounds === 1 ? '' : 's'} (higher is better)`)}</text>`,
    `<text x="12" y="40" class="axis">${esc(`POST /charges, ${o.duration} s per case, ${o.connections} connections; ${results.machine.cores} cores shared by the server, the load generator and the store; ${results.date.slice(0, 10)}`)}</text>`,
    ...legend,
    ...grid,
    ...parts,
    `<text x="${left + plotWidth / 2}" y="${height - 6}" text-anchor="middle" class="axis">requests per second (higher is better)</text>`,
    '</svg>',
    '',
  ].join('\n');
}

function niceStep(raw: number): number {
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * power) return m * power;
  return 10 * power;
}
