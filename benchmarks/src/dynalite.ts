// dynalite (DynamoDB's API, in Node, in memory) in a process of its own, loaded from @oncely/dynamodb's dev
// dependencies; prints {"port": n}. Used only when packages/dynamodb is present.

import type { Server } from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { readConfig } from './config';

const { packageJson } = readConfig<{ packageJson: string }>();
const dynalite = createRequire(packageJson)('dynalite') as (options: object) => Server;
const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);
});
process.on('SIGTERM', () => process.exit(0));
