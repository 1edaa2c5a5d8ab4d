// A NestJS 11 app on @nestjs/platform-express (Express 5 under Nest): bare, with @oncely/nestjs, or with
// @node-idempotency/nestjs used as its README says: NodeIdempotencyModule.forRootAsync({ storage: { adapter,
// options } }) and @Idempotent() on the handler. Decorators need experimentalDecorators (benchmarks/tsconfig.json, read by tsx); @Body() is applied
// by hand below, since the repository's linter does not parse parameter decorators.
import 'reflect-metadata';
import type { Server } from 'node:http';
import { Body, Controller, HttpCode, type INestApplication, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Idempotent, NodeIdempotencyModule } from '@node-idempotency/nestjs';
import { IdempotencyModule, Idempotent as OncelyIdempotent } from '@oncely/nestjs';
import type { ServerKind, Services } from './config';
import { type ChargeRequest, charge } from './route';
import { openStore } from './stores';

@Controller()
class BareController {
  @Post('charges')
  @HttpCode(201)
  create(body: ChargeRequest) {
    return charge(body);
  }
}
// What `create(@Body() body)` does.
Body()(BareController.prototype, 'create', 0);

@Controller()
class IdempotentController {
  @Idempotent()
  @Post('charges')
  @HttpCode(201)
  create(body: ChargeRequest) {
    return charge(body);
  }
}
Body()(IdempotentController.prototype, 'create', 0);

@Controller()
class OncelyController {
  @OncelyIdempotent()
  @Post('charges')
  @HttpCode(201)
  create(body: ChargeRequest) {
    return charge(body);
  }
}
Body()(OncelyController.prototype, 'create', 0);

export async function startNest(
  kind: ServerKind,
  services: Services,
): Promise<{ server: Server; close: () => Promise<void> }> {
  let root: new () => unknown;
  let closeStore = async () => {};
  if (kind.impl === 'bare') {
    @Module({ controllers: [BareController] })
    class BareModule {}
    root = BareModule;
  } else if (kind.impl === 'oncely') {
    // @oncely/nestjs as its README says: IdempotencyModule.forRoot({ store }) and @Idempotent() on the handler.
    const opened = await openStore(kind.store, services);
    closeStore = () => opened.close();
    @Module({
      imports: [IdempotencyModule.forRoot({ store: opened.store })],
      controllers: [OncelyController],
    })
    class OncelyModule {}
    root = OncelyModule;
  } else if (kind.impl === 'nest') {
    // StorageAdapterEnum.memory / .redis are the strings 'memory' / 'redis'; for redis, `options` are node-redis
    // client options.
    const storage =
      kind.store === 'redis'
        ? { adapter: 'redis' as const, options: { url: services.redisUrl } }
        : { adapter: 'memory' as const };
    @Module({
      imports: [NodeIdempotencyModule.forRootAsync({ storage } as never)],
      controllers: [IdempotentController],
    })
    class IdempotentModule {}
    root = IdempotentModule;
  } else {
    throw new Error(`not a NestJS server: ${JSON.stringify(kind)}`);
  }
  const app: INestApplication = await NestFactory.create(root, { logger: false });
  await app.listen(0, '127.0.0.1');
  return {
    server: app.getHttpServer() as Server,
    close: async () => {
      await app.close();
      await closeStore();
    },
  };
}
