export interface Service {
  name: string;
  /** Where it was looked for, e.g. `127.0.0.1:6379 (REDIS_URL)`. */
  where: string;
  /** Resolves with undefined when the service answers as itself, or with what is wrong. */
  check(): Promise<string | undefined>;
  /** How to start or install it. */
  start: string;
}
export interface Missing {
  service: Service;
  reason: string;
  files: string[];
}
export function services(env?: Record<string, string | undefined>): Record<string, Service>;
export function servicesOf(path: string, known: Record<string, Service>): string[];
export function partition(paths: string[]): Promise<{ run: Set<string>; missing: Missing[] }>;
export function lines(missing: Missing[]): string[];
export const state: { missing: Missing[] };
