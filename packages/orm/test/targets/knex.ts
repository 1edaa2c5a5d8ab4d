// Knex targets of the ORM suite: the orders table is made, written, counted and dropped through Knex itself.
import type { OrmSuiteTarget } from '@oncely/testing';
import knexFactory, { type Knex } from 'knex';
import { knexTransactions } from '../../src/knex';
import { mysqlStore, mysqlUrl, POOL_SIZE, postgresStore, postgresUrl } from './stores';

export function knexTarget(id: string, client: 'pg' | 'mysql2'): OrmSuiteTarget<Knex.Transaction> {
  const url = client === 'pg' ? postgresUrl : mysqlUrl;
  const db = knexFactory({ client, connection: url, pool: { min: 0, max: POOL_SIZE } });
  const transactions = knexTransactions(db);
  const { store, schema, orders, ...records } = (client === 'pg' ? postgresStore : mysqlStore)(
    id,
    transactions,
  );
  const table = (on: Knex | Knex.Transaction) =>
    schema === undefined ? on(orders) : on(orders).withSchema(schema);
  return {
    name: `knex (${client}) on ${client === 'pg' ? 'PostgreSQL' : 'MariaDB'}`,
    dialect: transactions.dialect,
    store,
    setup: async () => {
      await records.migrate();
      const builder = schema === undefined ? db.schema : db.schema.withSchema(schema);
      if (await builder.hasTable(orders)) return;
      await builder.createTable(orders, (t) => {
        t.increments('id');
        t.string('key', 200).notNullable().index();
      });
    },
    insertOrder: async (trx, key) => {
      await table(trx).insert({ key });
    },
    countOrders: async (key) => {
      const query = table(db).count({ n: '*' });
      if (key !== undefined) void query.where({ key });
      const [row] = await query;
      return Number(row?.n ?? 0);
    },
    transactionOf: (request) => transactions.transactionOf(request),
    drop: async () => {
      // On PostgreSQL the orders table goes with the store's schema.
      if (schema === undefined) await db.schema.dropTableIfExists(orders);
      await records.drop();
    },
    close: async () => {
      await records.close();
      await db.destroy();
    },
  };
}
