// The ORM suite's app in a process of its own (started by ormSuite's crash test with tsx): it loads the target
// module ORM_TARGET with the suite's id ORM_TARGET_ID, prints `{"port": n}`, and on each request inserts through the
// ORM, prints `inserted <key>` and never answers, so that the test can SIGKILL it between the insert and the commit.
import { loadOrmTarget, ormSuiteApp } from './orm-suite';

const target = await loadOrmTarget(process.env.ORM_TARGET as string, process.env.ORM_TARGET_ID as string);
const { app } = ormSuiteApp(target, async (key) => {
  console.log(`inserted ${key}`);
  await new Promise(() => {});
});
const server = app.listen(0, '127.0.0.1', () => {
  const address = server.address();
  console.log(JSON.stringify({ port: typeof address === 'object' && address ? address.port : 0 }));
});
