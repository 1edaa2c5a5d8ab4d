// A NestJS 10 app on @nestjs/platform-express (Express 4 under Nest), bare or with @node-idempotency/nestjs used
// as its README says: NodeIdempotencyModule.forRootAsync({ storage: { adapter, options } }) and @Idempotent() on
// the handler. Decorators need experimentalDecorators (benchmarks/tsconfig.json, read by tsx); @Body() is applied
// by hand below, since the repository's linter does not parse parameter decorators.
import 'reflect-metadata';
import type { Server } from 'node:http';
import { Body, Controller, HttpCode, type INestApplication, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Idempotent, NodeIdempotencyModule } from '@node-idempotency/nestjs';
import type { Services } from './config';
import { type ChargeRequest, charge } from './route';

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

export async function startNest(
  store: 'none' | 'memory' | 'redis',
  services: Services,
): Promise<{ server: Server; close: () => Promise<void> }> {
  let root: new () => unknown;
  if (store === 'none') {
    @Module({ controllers: [BareController] })
    class BareModule {}
    root = BareModule;
  } else {
    // StorageAdapterEnum.memory / .redis are the strings 'memory' / 'redis'; for redis, `options` are node-redis
    // client options.
    const storage =
      store === 'redis'
        ? { adapter: 'redis' as const, options: { url: services.redisUrl } }
        : { adapter: 'memory' as const };
    @Module({
      imports: [NodeIdempotencyModule.forRootAsync({ storage } as never)],
      controllers: [IdempotentController],
    })
    class IdempotentModule {}
    root = IdempotentModule;
  }
  const app: INestApplication = await NestFactory.create(root, { logger: false });
  await app.listen(0, '127.0.0.1');
  return { server: app.getHttpServer() as Server, close: () => app.close() };
}
