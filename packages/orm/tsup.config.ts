import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// One entry per ORM, so that importing one never loads another's types or code.
export default defineConfig({
  ...packageBuild,
  entry: {
    prisma: 'src/prisma/index.ts',
    drizzle: 'src/drizzle/index.ts',
    kysely: 'src/kysely/index.ts',
    knex: 'src/knex/index.ts',
    typeorm: 'src/typeorm/index.ts',
  },
  splitting: true,
});
