export interface SqsServerNode {
  path: string;
  /** `v22.23.3`. */
  version: string;
  /** How it was found, for messages: `SQS_SERVER_NODE`, `the running Node`, or `the npm package node-…`. */
  from: string;
}
export function sqsServerNode(env?: Record<string, string | undefined>): SqsServerNode;
export function sqsServerProblem(env?: Record<string, string | undefined>): string | undefined;
/** The script that runs fauxqs: `node sqs-server-child.mjs [--port N] [--watch-stdin]`. */
export const CHILD: string;
export const MINIMUM: readonly [number, number];
