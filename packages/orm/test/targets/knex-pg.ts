import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { knexTarget } from './knex';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  return knexTarget(id, 'pg');
}
