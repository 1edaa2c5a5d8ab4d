/**
 * The Grafana dashboard and the Prometheus alert rules shipped in observability/ query only the series this package
 * exports, with the names and labels @opentelemetry/exporter-prometheus writes (scraped over HTTP here), and every
 * exported series is on a panel. Each PromQL expression is parsed with Prometheus' own grammar.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Idempotency, idempotent, MemoryStore } from '@oncely/core';
import { otel, otelHooks } from '@oncely/opentelemetry';
import { freePort, sleep } from '@oncely/testing';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import { parser } from '@prometheus-io/lezer-promql';
import { parse as parseYaml } from 'yaml';

const observability = join(__dirname, '../observability');
const dashboard = JSON.parse(
  readFileSync(join(observability, 'grafana-dashboard.json'), 'utf8'),
) as Dashboard;
const rulesPath = join(observability, 'prometheus-alerts.yaml');
const rules = parseYaml(readFileSync(rulesPath, 'utf8')) as RuleFile;
const docs = readFileSync(join(__dirname, '../../../docs/observability.md'), 'utf8');

interface Panel {
  type: string;
  title: string;
  description?: string;
  targets?: { expr: string }[];
  panels?: Panel[];
}
interface Dashboard {
  panels: Panel[];
  templating: { list: { name: string; type: string; definition?: string }[] };
}
interface Rule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
interface RuleFile {
  groups: { name: string; rules: Rule[] }[];
}

/** Labels Prometheus adds at scrape time (or the OTLP receiver from the resource), and the buckets' `le`. */
const TARGET_LABELS = ['job', 'instance'];

let exposition: { series: Set<string>; labels: Set<string> };

beforeAll(async () => {
  const port = await freePort();
  const exporter = new PrometheusExporter({ host: '127.0.0.1', port, preventServerStart: true });
  const meterProvider = new MeterProvider({ readers: [exporter] });
  try {
    await exporter.startServer();
    await recordEveryMetric(meterProvider);
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    exposition = parseExposition(text);
  } finally {
    await meterProvider.shutdown();
  }
});

/** Makes every instrument report, each with every label it can carry. */
async function recordEveryMetric(meterProvider: MeterProvider): Promise<void> {
  const store = new MemoryStore();
  const engine = new Idempotency({ store, inProgress: { wait: '1s' }, ...otel({ meterProvider }) });
  const input = { method: 'POST', url: '/x', headers: { 'idempotency-key': 'dash' }, body: {}, request: {} };
  const first = await engine.handle(input);
  if (first.action !== 'execute') throw new Error('expected execute');
  // A second request waits for the first (oncely_wait_duration), which runs a step (oncely_steps_total).
  const waiting = engine.handle(input);
  await sleep(30);
  await first.execution.context.step('dash-step', () => 1);
  await first.execution.complete({ status: 201, headers: {}, body: new Uint8Array() });
  expect((await waiting).action).toBe('respond');
  // A failing store: a store_error decision and a failed operation (error_type).
  class Unreachable extends Error {}
  const down = new Idempotency({
    store: Object.assign(new MemoryStore(), { acquire: () => Promise.reject(new Unreachable('down')) }),
    ...otel({ meterProvider }),
  });
  expect((await down.handle(input)).action).toBe('respond');
  // The consumer adapter kind.
  await idempotent(async (id: string) => id, { key: (id) => id, store, ...otel({ meterProvider }) })(
    'dash-msg',
  );
  // Unconfirmed writes come from Redis replicas not confirming in time: the hooks receive what RedisStore reports.
  const hooks = otelHooks({ meterProvider, traces: false });
  hooks.onUnconfirmedWrite?.({ adapter: 'http', operation: 'complete', outcome: 'unconfirmed', key: 'dash' });
  hooks.onUnconfirmedWrite?.({ adapter: 'http', operation: 'complete', outcome: 'lost', key: 'dash' });
  await store.close();
}

/** Series names (histograms as their `_bucket`, `_sum`, `_count`) and label names of a text exposition. */
function parseExposition(text: string): { series: Set<string>; labels: Set<string> } {
  const series = new Set<string>();
  const labels = new Set<string>();
  for (const line of text.split('\n')) {
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? /.exec(line);
    if (sample?.[1] === undefined || sample[1] === 'target_info') continue;
    series.add(sample[1]);
    for (const m of (sample[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) labels.add(m[1] as string);
  }
  return { series, labels };
}

/** Grafana's interval variables, which PromQL cannot parse, as a duration; label values like "$job" are strings. */
function withoutGrafanaVariables(expr: string): string {
  return expr.replace(/\$__(rate_interval|interval|range)\b/g, '5m');
}

interface Parsed {
  metrics: string[];
  labels: string[];
  errors: string[];
}

/** Parses a PromQL expression with Prometheus' grammar: the metric names, the label names and the syntax errors. */
function parsePromql(source: string): Parsed {
  const expr = withoutGrafanaVariables(source);
  const out: Parsed = { metrics: [], labels: [], errors: [] };
  parser.parse(expr).iterate({
    enter(node) {
      const text = expr.slice(node.from, node.to);
      if (node.type.isError)
        out.errors.push(`at ${node.from}: ${JSON.stringify(expr.slice(node.from, node.from + 20))}`);
      else if (node.name === 'Identifier' && node.node.parent?.name === 'VectorSelector')
        out.metrics.push(text);
      else if (node.name === 'LabelName') out.labels.push(text);
    },
  });
  if (expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').includes('$'))
    out.errors.push(`a Grafana variable outside a label value: ${expr}`);
  return out;
}

/** Every PromQL expression of the dashboard (panels, rows' panels and the variables' label_values selectors). */
function dashboardExpressions(): { where: string; expr: string }[] {
  const out: { where: string; expr: string }[] = [];
  const visit = (panels: Panel[]) => {
    for (const panel of panels) {
      for (const target of panel.targets ?? [])
        out.push({ where: `panel "${panel.title}"`, expr: target.expr });
      visit(panel.panels ?? []);
    }
  };
  visit(dashboard.panels);
  for (const variable of dashboard.templating.list) {
    if (variable.type !== 'query') continue;
    const selector = /^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$/.exec(variable.definition ?? '')?.[1];
    out.push({
      where: `variable ${variable.name}`,
      expr: selector ?? `unparsed label_values: ${variable.definition}`,
    });
  }
  return out;
}

function ruleExpressions(): { where: string; expr: string }[] {
  return rules.groups.flatMap((group) =>
    group.rules.map((rule) => ({ where: `alert ${rule.alert}`, expr: rule.expr })),
  );
}

/** What is wrong with each expression: syntax errors, metrics or labels the package does not export. */
function problemsOf(expressions: { where: string; expr: string }[]): string[] {
  const problems: string[] = [];
  for (const { where, expr } of expressions) {
    const parsed = parsePromql(expr);
    for (const error of parsed.errors) problems.push(`${where}: PromQL syntax error ${error}`);
    if (parsed.metrics.length === 0) problems.push(`${where}: no metric in ${expr}`);
    for (const name of parsed.metrics)
      if (!exposition.series.has(name)) problems.push(`${where}: ${name} is not exported`);
    for (const label of parsed.labels)
      if (!exposition.labels.has(label) && !TARGET_LABELS.includes(label))
        problems.push(`${where}: label ${label} is on no exported series`);
  }
  return problems;
}

/** GitHub's anchor of a heading. */
function anchorOf(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[^a-z0-9 _-]/g, '')
    .replace(/ /g, '-');
}

test('the exporter wrote every metric of the package, so the checks below compare against all of them', () => {
  const families = ['oncely_decisions_total', 'oncely_executions_active', 'oncely_steps_total'];
  families.push('oncely_store_unconfirmed_writes_total', 'oncely_store_unconfirmed_writes_ended_total');
  for (const histogram of ['oncely_store_operation_duration', 'oncely_wait_duration'])
    for (const suffix of ['_bucket', '_sum', '_count']) families.push(histogram + suffix);
  expect([...exposition.series].sort()).toEqual(families.sort());
  expect(exposition.labels).toEqual(
    new Set([
      'oncely_outcome',
      'oncely_adapter',
      'oncely_store_operation',
      'error_type',
      'oncely_step_outcome',
      'oncely_unconfirmed_outcome',
      'le',
      'otel_scope_name',
      'otel_scope_version',
    ]),
  );
});

test('the checks name a metric the package does not export, a label it does not set and a syntax error', () => {
  expect(
    problemsOf([
      { where: 'a', expr: 'rate(oncely_decisions{oncely_outcome="fenced"}[5m])' },
      { where: 'b', expr: 'sum by (oncely_scope) (oncely_executions_active)' },
      { where: 'c', expr: 'sum(rate(oncely_steps_total[$__rate_interval])' },
    ]),
  ).toEqual([
    'a: oncely_decisions is not exported',
    'b: label oncely_scope is on no exported series',
    expect.stringMatching(/^c: PromQL syntax error at \d+/),
  ]);
});

test("every PromQL expression of the dashboard parses and uses only the package's series and labels", () => {
  const expressions = dashboardExpressions();
  expect(expressions.length).toBeGreaterThanOrEqual(20);
  expect(problemsOf(expressions)).toEqual([]);
});

test('every exported series is on a panel of the dashboard', () => {
  const used = new Set(
    dashboardExpressions()
      .filter(({ where }) => where.startsWith('panel'))
      .flatMap(({ expr }) => parsePromql(expr).metrics),
  );
  expect([...exposition.series].filter((name) => !used.has(name))).toEqual([]);
});

test('every panel says what it shows, and the variables are the data source, job, instance and adapter', () => {
  const panels = dashboard.panels.filter((panel) => panel.type !== 'row');
  for (const panel of panels)
    expect([panel.title, (panel.description ?? '').length > 40]).toEqual([panel.title, true]);
  // Each panel is listed in the docs by its title.
  for (const panel of panels)
    expect([panel.title, docs.includes(`**${panel.title}**`)]).toEqual([panel.title, true]);
  expect(dashboard.templating.list.map((v) => v.name)).toEqual(['datasource', 'job', 'instance', 'adapter']);
});

test('every alert rule parses, uses only exported series and labels, and links its runbook in the docs', () => {
  const all = rules.groups.flatMap((group) => group.rules);
  expect(all.length).toBeGreaterThanOrEqual(8);
  expect(problemsOf(ruleExpressions())).toEqual([]);
  const anchors = new Set([...docs.matchAll(/^#{2,4} (.+)$/gm)].map((m) => anchorOf(m[1] as string)));
  for (const rule of all) {
    const { summary, description, runbook_url } = rule.annotations ?? {};
    expect([rule.alert, typeof summary, typeof description]).toEqual([rule.alert, 'string', 'string']);
    expect([rule.alert, rule.labels?.severity]).toEqual([
      rule.alert,
      expect.stringMatching(/^(critical|warning)$/),
    ]);
    const anchor = /^https:\/\/github\.com\/oncely\/oncely\/blob\/main\/docs\/observability\.md#(.+)$/.exec(
      runbook_url ?? '',
    )?.[1];
    expect([rule.alert, anchor, anchor !== undefined && anchors.has(anchor)]).toEqual([
      rule.alert,
      anchor,
      true,
    ]);
  }
});

test("the docs' copies of the alert rules are the shipped ones", () => {
  const shipped = new Map(ruleExpressions().map(({ where, expr }) => [where, expr.trim()]));
  const blocks = [...docs.matchAll(/```yaml\n([\s\S]*?)```/g)].map(
    (m) => parseYaml(m[1] as string) as Rule[],
  );
  const documented = blocks.flat().filter((rule) => typeof rule?.alert === 'string');
  expect(documented.length).toBeGreaterThanOrEqual(1);
  for (const rule of documented)
    expect([rule.alert, rule.expr.trim()]).toEqual([rule.alert, shipped.get(`alert ${rule.alert}`)]);
});

interface PromtoolTests {
  tests: { alert_rule_test: { alertname: string; exp_alerts: unknown[] }[] }[];
}

test('every alert rule has a promtool unit test in which it fires', () => {
  const unit = parseYaml(
    readFileSync(join(__dirname, 'prometheus-alerts.promtool.yaml'), 'utf8'),
  ) as PromtoolTests;
  const firing = new Set(
    unit.tests.flatMap((t) =>
      t.alert_rule_test.filter((a) => a.exp_alerts.length > 0).map((a) => a.alertname),
    ),
  );
  expect([...firing].sort()).toEqual(
    ruleExpressions()
      .map(({ where }) => where.replace('alert ', ''))
      .sort(),
  );
});

// promtool comes with Debian's `prometheus` package: CI installs it (.ci/run), so there it must be present; on a
// developer's machine without it, skipped.
const promtool = spawnSync('promtool', ['--version']).status === 0;
(promtool || process.env.CI ? test : test.skip)(
  'promtool accepts the rule file and passes its unit tests',
  () => {
    const check = spawnSync('promtool', ['check', 'rules', rulesPath], { encoding: 'utf8' });
    expect([check.status, check.stdout + check.stderr]).toEqual([0, expect.stringContaining('SUCCESS')]);
    const unit = spawnSync('promtool', ['test', 'rules', 'prometheus-alerts.promtool.yaml'], {
      cwd: __dirname,
      encoding: 'utf8',
    });
    expect([unit.status, unit.stdout + unit.stderr]).toEqual([0, expect.stringContaining('SUCCESS')]);
  },
);
