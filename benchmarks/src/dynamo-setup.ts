// DynamoDB joins the matrix only when packages/dynamodb exists and builds. Its store runs against dynalite (the
// DynamoDB API in Node, in memory, in a child process): the numbers say what oncely's code costs, not what AWS
// DynamoDB's latency would be.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { type Child, firstLine, startChild } from './child';
import type { Services } from './config';

process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = 'true';

export interface DynamoSetup {
  services: NonNullable<Services['dynamo']>;
  stop(): Promise<void>;
}

/** A DynamoSetup, or why DynamoDB is left out. */
export async function setupDynamo(root: string, runId: string): Promise<DynamoSetup | string> {
  const dir = join(root, 'packages', 'dynamodb');
  const packageJson = join(dir, 'package.json');
  if (!existsSync(join(dir, 'src', 'index.ts')) || !existsSync(packageJson))
    return 'packages/dynamodb does not exist yet, so DynamoDB is not in the matrix.';
  try {
    // Through scripts/pnpm.mjs, as `pnpm bench` itself: a machine with only Node and npm has no `pnpm` on PATH.
    execFileSync(
      process.execPath,
      [join(root, 'scripts', 'pnpm.mjs'), '--filter', '@oncely/dynamodb', 'build'],
      {
        cwd: root,
        stdio: 'pipe',
        timeout: 180_000,
      },
    );
  } catch (error) {
    const output =
      String((error as { stdout?: Buffer }).stdout ?? '') +
        String((error as { stderr?: Buffer }).stderr ?? '') || String((error as Error).message);
    return `packages/dynamodb exists but does not build yet (\`pnpm --filter @oncely/dynamodb build\` failed: ${output.trim().split('\n').slice(-2).join(' ').slice(0, 200)}), so DynamoDB is not in the matrix.`;
  }
  const modulePath = join(dir, 'dist', 'index.js');
  const require = createRequire(packageJson);
  try {
    require.resolve('dynalite');
    require.resolve('@aws-sdk/client-dynamodb');
  } catch {
    return 'packages/dynamodb is built but dynalite or @aws-sdk/client-dynamodb is not installed with it, so DynamoDB is not in the matrix.';
  }
  let proc: Child | undefined;
  try {
    proc = startChild('src/dynalite.ts', { packageJson });
    const { port } = await firstLine<{ port: number }>(proc, 'dynalite');
    const endpoint = `http://127.0.0.1:${port}`;
    const table = `oncely-bench-${runId}`;
    const { DynamoDBStore } = (await import(pathToFileURL(modulePath).href)) as {
      DynamoDBStore: new (options: object) => { createTable(): Promise<unknown> };
    };
    const sdk = require('@aws-sdk/client-dynamodb') as {
      DynamoDBClient: new (config: object) => { destroy(): void };
    };
    const client = new sdk.DynamoDBClient({
      endpoint,
      region: 'us-east-1',
      credentials: { accessKeyId: 'bench', secretAccessKey: 'bench' },
    });
    await new DynamoDBStore({ client, tableName: table }).createTable();
    client.destroy();
    const child = proc;
    return { services: { endpoint, table, modulePath, sdkPath: packageJson }, stop: () => child.stop() };
  } catch (error) {
    await proc?.stop();
    return `packages/dynamodb is built but could not be set up on dynalite (${String(error).split('\n')[0]}), so DynamoDB is not in the matrix.`;
  }
}
