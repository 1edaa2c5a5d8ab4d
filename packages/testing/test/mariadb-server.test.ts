/**
 * @services mariadb-server
 */
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { mariadbBinary, type PrivateMariadb, startMariadbServer } from '../src';

const run = promisify(execFile);

// A query through the client with a deadline: a paused server accepts the connection and never answers.
async function query(port: number, sql: string, timeoutMs = 3000): Promise<string> {
  const { stdout } = await run(
    mariadbBinary('mariadb', 'mysql'),
    ['--no-defaults', '-h127.0.0.1', `-P${port}`, '-uroot', '-N', '-B', '-e', sql, 'test'],
    { timeout: timeoutMs },
  );
  return stdout.trim();
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.once('connect', () => resolve(socket.destroy() === socket));
    socket.once('error', () => resolve(false));
  });
}

describe('startMariadbServer', () => {
  let server: PrivateMariadb;
  afterAll(() => server?.stop());

  test('serves root without password over TCP; pauses, resumes, dies and restarts on its data', async () => {
    server = await startMariadbServer();
    expect(server.url).toBe(`mysql://root@127.0.0.1:${server.port}/test`);
    expect(await query(server.port, 'SELECT DATABASE(), CURRENT_USER()')).toBe('test\troot@127.0.0.1');
    await server.sql('CREATE TABLE kept (id INT PRIMARY KEY); INSERT INTO kept VALUES (1)');

    server.pause();
    await expect(query(server.port, 'SELECT 1', 1500)).rejects.toMatchObject({ killed: true });
    server.resume();
    expect(await query(server.port, 'SELECT 2')).toBe('2');

    await server.kill();
    expect(await portOpen(server.port)).toBe(false);
    await server.restart();
    // Committed before the SIGKILL, so still there after crash recovery.
    expect(await query(server.port, 'SELECT id FROM kept')).toBe('1');
  }, 40_000);
});

describe('a process that exits without stopping its server', () => {
  test('takes the server and its directory with it', async () => {
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        `import { startMariadbServer } from ${JSON.stringify(join(__dirname, '../src/mariadb-server.ts'))};
         const server = await startMariadbServer();
         const dir = (await server.sql('SELECT @@datadir')).replace(/\\/data\\/?$/, '');
         console.log(JSON.stringify({ port: server.port, dir }));
         process.exit(0);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk) => {
      out += chunk;
    });
    const code = await new Promise((resolve) => child.once('exit', resolve));
    expect(code).toBe(0);
    const { port, dir } = JSON.parse(out) as { port: number; dir: string };
    expect(dir).toMatch(/oncely-mariadb-/);
    expect(existsSync(dir)).toBe(false);
    expect(await portOpen(port)).toBe(false);
  }, 40_000);
});
