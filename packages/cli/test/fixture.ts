import { type AddressInfo, createServer, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import type { IdempotencyStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import { type Io, main } from '../src';

/** The three kinds of record the command shows, written by a real store through the Express adapter. */
export interface Written {
  scope: string;
  /** Completed: 201 with a JSON body. */
  completed: string;
  /** In progress: its handler waits until `finish()`. */
  inProgress: string;
  /** Released with one recorded step (`charge`): its handler recorded it, then answered 500. */
  released: string;
  /** Lets the in-progress request finish and closes the app. */
  finish(): Promise<void>;
}

export async function writeRecords(store: IdempotencyStore, tag: string): Promise<Written> {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store, scope: (req) => String(req.headers['x-tenant']) }));
  app.post('/pay', (_req, res) => {
    res.status(201).json({ paid: true, amount: 42 });
  });
  app.post('/hold', async (_req, res) => {
    await gate;
    res.json({ held: true });
  });
  app.post('/steps', async (req, res) => {
    const context = req.idempotency;
    if (context === undefined) throw new Error('not covered');
    await context.step('charge', () => ({ id: 7 }));
    res.status(500).json({ failed: 'after the charge' });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const scope = `tenant ${tag}`;
  const keys = { completed: `paid-${tag}`, inProgress: `held-${tag}`, released: `stepped-${tag}` };
  const post = (path: string, key: string) =>
    fetch(base + path, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'x-tenant': scope, 'content-type': 'application/json' },
      body: JSON.stringify({ order: key }),
    });
  const paid = await post('/pay', keys.completed);
  if (paid.status !== 201) throw new Error(`/pay answered ${paid.status}`);
  const stepped = await post('/steps', keys.released);
  if (stepped.status !== 500) throw new Error(`/steps answered ${stepped.status}`);
  const held = post('/hold', keys.inProgress);
  // In progress once the store holds its lease.
  const storeKey = `${scope} ${keys.inProgress}`;
  for (let i = 0; (await store.get?.(storeKey))?.state !== 'in_progress'; i++) {
    if (i > 200) throw new Error('the held request never reserved its key');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return {
    scope,
    ...keys,
    finish: async () => {
      open();
      await (await held).text();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

export interface Run {
  code: number;
  stdout: string;
  stderr: string;
  /** stdout parsed as JSON (for --json runs). */
  json<T = Record<string, unknown>>(): T;
}

/**
 * Runs the command in this process, with only `env` as environment, and a stdin that is not a terminal unless
 * `terminal` gives what a person types on one.
 */
export async function oncely(
  args: string[],
  env: Record<string, string | undefined> = {},
  terminal?: { typed: string },
): Promise<Run> {
  let stdout = '';
  let stderr = '';
  const stdin = Object.assign(Readable.from(terminal === undefined ? [] : [terminal.typed]), {
    isTTY: terminal !== undefined,
  });
  const io: Io = {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text), isTTY: terminal !== undefined },
    stdin,
    env,
  };
  const code = await main(args, io);
  return { code, stdout, stderr, json: <T>() => JSON.parse(stdout) as T };
}

/** A TCP server that accepts connections and never answers: a store that hangs. */
export async function silentServer(): Promise<{ port: number; close(): void }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () => {
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}
