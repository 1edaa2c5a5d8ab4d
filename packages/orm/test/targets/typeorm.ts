// TypeORM targets of the ORM suite: an EntitySchema for the orders (no decorator compiler settings needed), the
// table made, written, counted and dropped through TypeORM itself.
import type { OrmSuiteTarget } from '@oncely/testing';
import { DataSource, type EntityManager, EntitySchema, Table } from 'typeorm';
import { typeormTransactions } from '../../src/typeorm';
import { mysqlStore, mysqlUrl, POOL_SIZE, postgresStore, postgresUrl } from './stores';

interface Order {
  id: number;
  key: string;
}

export async function typeormTarget(
  id: string,
  type: 'postgres' | 'mariadb',
): Promise<OrmSuiteTarget<EntityManager>> {
  const postgres = type === 'postgres';
  const { schema, orders: ordersTable } = postgres
    ? { schema: `oncely_orm_${id}`, orders: 'orders' }
    : { schema: undefined, orders: `oncely_orm_${id}_orders` };
  const orders = new EntitySchema<Order>({
    name: 'Order',
    tableName: ordersTable,
    ...(schema === undefined ? {} : { schema }),
    columns: {
      id: { type: Number, primary: true, generated: 'increment' },
      key: { type: String, length: 200 },
    },
  });
  const dataSource = new DataSource({
    type,
    url: postgres ? postgresUrl : mysqlUrl,
    poolSize: POOL_SIZE,
    entities: [orders],
  });
  await dataSource.initialize();
  const transactions = typeormTransactions(dataSource);
  const records = (postgres ? postgresStore : mysqlStore)(id, transactions);
  const tablePath = schema === undefined ? ordersTable : `${schema}.${ordersTable}`;
  return {
    name: `typeorm (${type}) on ${postgres ? 'PostgreSQL' : 'MariaDB'}`,
    dialect: transactions.dialect,
    store: records.store,
    setup: async () => {
      await records.migrate();
      const runner = dataSource.createQueryRunner();
      try {
        const table = new Table({
          name: tablePath,
          columns: [
            { name: 'id', type: 'int', isPrimary: true, isGenerated: true, generationStrategy: 'increment' },
            { name: 'key', type: 'varchar', length: '200' },
          ],
        });
        await runner.createTable(table, true);
      } finally {
        await runner.release();
      }
    },
    insertOrder: async (manager, key) => {
      await manager.getRepository(orders).insert({ key });
    },
    countOrders: (key) => dataSource.getRepository(orders).countBy(key === undefined ? {} : { key }),
    transactionOf: (request) => transactions.transactionOf(request),
    drop: async () => {
      // On PostgreSQL the orders table goes with the store's schema.
      if (schema === undefined) {
        const runner = dataSource.createQueryRunner();
        await runner.dropTable(ordersTable, true).finally(() => runner.release());
      }
      await records.drop();
    },
    close: async () => {
      await records.close();
      await dataSource.destroy();
    },
  };
}
