import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { typeormTarget } from './typeorm';

export function createTarget({ id }: OrmSuiteTargetOptions) {
  return typeormTarget(id, 'postgres');
}
