import type { ListPage, RecordView, Stats } from './backends/types';

/** Output for people: aligned `name  value` lines, times with how far off they are. */

function duration(ms: number): string {
  const s = Math.round(ms / 1000);
  if (Math.abs(ms) < 10_000) return `${(ms / 1000).toFixed(1)} s`;
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172_800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86_400)} d`;
}

function when(date: Date, now: number): string {
  const ms = date.getTime() - now;
  return `${date.toISOString()} (${ms >= 0 ? `in ${duration(ms)}` : `${duration(-ms)} ago`})`;
}

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

const STATE_TEXT = { in_progress: 'in progress', completed: 'completed', released: 'released' } as const;

function lines(rows: [string, string][], indent = ''): string {
  const width = Math.max(...rows.map(([name]) => name.length));
  return rows.map(([name, value]) => `${indent}${name.padEnd(width)}  ${value}\n`).join('');
}

export function formatRecord(record: RecordView, now = Date.now()): string {
  const rows: [string, string][] = [['key', record.key]];
  if (record.scope !== undefined) rows.push(['scope', record.scope]);
  let state: string = STATE_TEXT[record.state] ?? record.state;
  if (record.leaseLeftMs !== undefined) state += ` (lease: ${duration(record.leaseLeftMs)} left)`;
  if (record.state === 'released')
    state += ' (nobody holds it: the next request with this key resumes its steps)';
  rows.push(['state', state]);
  if (record.owner !== undefined) rows.push(['owner', record.owner]);
  if (record.fingerprint !== undefined) rows.push(['fingerprint', record.fingerprint]);
  if (record.createdAt !== undefined) rows.push(['created', when(record.createdAt, now)]);
  if (record.expiresAt !== undefined) rows.push(['expires', when(record.expiresAt, now)]);
  rows.push(['stored at', record.location]);
  if (record.bytes !== undefined) rows.push(['size', bytes(record.bytes)]);
  if (record.steps !== undefined) rows.push(['steps', String(record.steps.length)]);
  let text = lines(rows);
  if (record.steps !== undefined && record.steps.length > 0) {
    text += lines(
      record.steps.map((step) => [step.name, `${step.preview} (${bytes(step.bytes)})`]),
      '  ',
    );
  }
  const response = record.response;
  if (response !== undefined) {
    text += lines([['response', `${response.status}, body ${bytes(response.bodyBytes)}`]]);
    for (const [name, value] of Object.entries(response.headers)) {
      for (const one of Array.isArray(value) ? value : [value]) text += `  ${name}: ${one}\n`;
    }
    if (response.bodyBytes > 0) {
      const cut = Buffer.byteLength(response.bodyPreview) < response.bodyBytes ? ' …' : '';
      const label = response.bodyEncoding === 'base64' ? 'body (base64)' : 'body';
      text += `${label}\n  ${response.bodyPreview.replace(/\n/g, '\n  ')}${cut}\n`;
    }
  }
  return text;
}

export function formatList(page: ListPage, now = Date.now()): string {
  const rows = page.records.map((r) => [
    STATE_TEXT[r.state] ?? r.state,
    r.scope ?? '-',
    r.key,
    r.response !== undefined
      ? String(r.response.status)
      : r.leaseLeftMs !== undefined
        ? `lease ${duration(r.leaseLeftMs)}`
        : '',
    r.expiresAt !== undefined ? `expires in ${duration(r.expiresAt.getTime() - now)}` : '',
  ]);
  let text = '';
  if (rows.length === 0) text += 'no records in this page\n';
  else {
    const header = ['STATE', 'SCOPE', 'KEY', 'STATUS', 'EXPIRES'];
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] as string).length)));
    for (const row of [header, ...rows]) {
      text += `${row
        .map((cell, i) => cell.padEnd(widths[i] as number))
        .join('  ')
        .trimEnd()}\n`;
    }
  }
  if (page.cursor !== undefined) text += `more: --cursor ${page.cursor}\n`;
  return text;
}

export function formatStats(stats: Stats, description: string): string {
  const rows: [string, string][] = [
    ['store', description],
    ['records', String(stats.records)],
    ['  in progress', String(stats.byState.in_progress)],
    ['  completed', String(stats.byState.completed)],
    ['  released', String(stats.byState.released)],
  ];
  if (stats.bytes !== undefined) {
    const how =
      stats.bytesSampled !== undefined && stats.bytesSampled < stats.records
        ? ` (estimated from ${stats.bytesSampled} records)`
        : '';
    rows.push(['size', `${bytes(stats.bytes)}${how}`]);
  }
  if (stats.unknown > 0) rows.push(['not oncely records', String(stats.unknown)]);
  return lines(rows);
}
