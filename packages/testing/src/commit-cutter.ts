import { connect, createServer, type Socket } from 'node:net';

/**
 * A TCP proxy in front of PostgreSQL or MySQL/MariaDB that cuts the connection of the next COMMIT it carries, so a
 * test can make a client lose the answer to a COMMIT the server did (or did not) run:
 * - `'answer-lost'`: the COMMIT reaches the server; once the server answers it (it committed), the client's
 *   connection is closed without that answer;
 * - `'answer-withheld'`: the COMMIT reaches the server, its answer is dropped and the connection left open (a
 *   client-side timeout fires);
 * - `'commit-lost'`: the COMMIT never reaches the server; both sides are closed (the server rolls back).
 */
export type CommitCut = 'answer-lost' | 'answer-withheld' | 'commit-lost';

export interface CommitCutter {
  /** The port on 127.0.0.1 to connect the client to. */
  readonly port: number;
  /** Cuts the next COMMIT as `how`; the promise resolves once it has (for `'answer-lost'`: the server answered). */
  cutNextCommit(how: CommitCut): Promise<void>;
  /** Cuts nothing more (a COMMIT `cutNextCommit` still waits for goes through). */
  disarm(): void;
  /** Closes the proxy and every connection through it. */
  close(): Promise<void>;
}

const COMMIT = /^\s*commit\s*;?\s*$/i;
const SSL_OR_GSS_REQUEST = new Set([80877103, 80877104]);

/**
 * Reads what a PostgreSQL client sends, message by message, to tell a COMMIT: a simple query, a Parse (named or not)
 * of one, or a Bind of a statement parsed earlier as one (postgres.js prepares `commit` once per connection).
 */
class PostgresClientMessages {
  #pending = Buffer.alloc(0);
  /** Until the startup message (after any SSL or GSS request), messages have no type byte. */
  #started = false;
  readonly #commitStatements = new Set<string>();

  /** Whether `chunk` completes a message that runs a COMMIT. */
  feed(chunk: Buffer): boolean {
    this.#pending = Buffer.concat([this.#pending, chunk]);
    let commit = false;
    for (;;) {
      const typed = this.#started ? 1 : 0;
      if (this.#pending.length < typed + 4) break;
      const length = this.#pending.readUInt32BE(typed);
      if (this.#pending.length < typed + length) break;
      const body = this.#pending.subarray(typed + 4, typed + length);
      if (!this.#started) {
        this.#started = !SSL_OR_GSS_REQUEST.has(body.length >= 4 ? body.readUInt32BE(0) : 0);
      } else {
        const type = String.fromCharCode(this.#pending[0] as number);
        const strings = body.toString('latin1').split('\0');
        if (type === 'Q' && COMMIT.test(strings[0] ?? '')) commit = true;
        if (type === 'P' && COMMIT.test(strings[1] ?? '')) {
          this.#commitStatements.add(strings[0] ?? '');
          commit = true;
        }
        if (type === 'B' && this.#commitStatements.has(strings[1] ?? '\0')) commit = true;
      }
      this.#pending = this.#pending.subarray(typed + length);
    }
    return commit;
  }
}

/** Whether `chunk` (client to server) holds a MySQL COM_QUERY of COMMIT: 3-byte length, sequence, 0x03, text. */
function isMysqlCommit(chunk: Buffer): boolean {
  for (let at = 0; at + 4 <= chunk.length; ) {
    const length = chunk.readUIntLE(at, 3);
    const payload = chunk.subarray(at + 4, at + 4 + length);
    if (payload[0] === 0x03 && COMMIT.test(payload.subarray(1).toString('latin1'))) return true;
    at += 4 + length;
  }
  return false;
}

/** Whether `chunk` (server to client, after a COMMIT) is its answer: PostgreSQL's CommandComplete `COMMIT`. */
function isCommitAnswer(protocol: 'postgres' | 'mysql', chunk: Buffer): boolean {
  return protocol === 'mysql' || chunk.toString('latin1').includes('COMMIT\0');
}

export async function startCommitCutter(
  protocol: 'postgres' | 'mysql',
  target: { host: string; port: number },
): Promise<CommitCutter> {
  const sockets = new Set<Socket>();
  let armed: { how: CommitCut; done: () => void } | undefined;
  const server = createServer((client) => {
    const upstream = connect(target.port, target.host);
    sockets.add(client).add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    /** Set once this connection's COMMIT was cut: what happens to the server's next answer. */
    let cut: { how: CommitCut; done: () => void } | undefined;
    const messages = protocol === 'postgres' ? new PostgresClientMessages() : undefined;
    client.on('data', (chunk: Buffer) => {
      const commit = messages === undefined ? isMysqlCommit(chunk) : messages.feed(chunk);
      if (armed !== undefined && commit) {
        cut = armed;
        armed = undefined;
        if (cut.how === 'commit-lost') {
          end();
          cut.done();
          return;
        }
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (cut === undefined) {
        client.write(chunk);
        return;
      }
      if (cut.how === 'answer-withheld') {
        cut.done();
        return;
      }
      if (!isCommitAnswer(protocol, chunk)) {
        client.write(chunk);
        return;
      }
      client.destroy();
      cut.done();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return {
    port,
    cutNextCommit: (how) =>
      new Promise<void>((resolve) => {
        armed = { how, done: resolve };
      }),
    disarm: () => {
      armed = undefined;
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
