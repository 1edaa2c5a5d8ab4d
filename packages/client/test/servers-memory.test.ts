import { MemoryStore } from '@oncely/core';
import { expressServer, fastifyServer } from './servers';
import { clientSuite } from './suite';

for (const kind of [expressServer, fastifyServer]) clientSuite(kind, 'MemoryStore', () => new MemoryStore());
