import 'reflect-metadata';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { request as httpRequest, type ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import fastifyCompress from '@fastify/compress';
import {
  type ArgumentsHost,
  BadRequestException,
  type CallHandler,
  type CanActivate,
  Catch,
  Controller,
  type ExceptionFilter,
  type ExecutionContext,
  Get,
  Header,
  HttpCode,
  HttpException,
  type INestApplication,
  Inject,
  Injectable,
  Module,
  type NestInterceptor,
  Post,
  Query,
  Req,
  RequestTimeoutException,
  Res,
  Sse,
  StreamableFile,
  UseFilters,
  UseGuards,
  UseInterceptors,
} from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { type IdempotencyStore, MemoryStore, OncelyError } from '@oncely/core';
import { OBSERVERS } from '@oncely/core/adapter';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import { binaryParser, routeCounts, type TestApp } from '@oncely/testing';
import compression from 'compression';
import type { FastifyInstance } from 'fastify';
import { catchError, map, type Observable, TimeoutError, tap, throwError, timeout, timer } from 'rxjs';
import request from 'supertest';
import {
  IdempotencyKey,
  IdempotencyModule,
  type IdempotencyModuleOptions,
  Idempotent,
  type IdempotentRequest,
  scopeByHeader,
} from '../src';
import { COUNTS, type Platform, type PlatformResponse, serveNest } from './harness';

type Counts = ReturnType<typeof routeCounts>;
const newKey = () => `key-${randomUUID()}`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

@Controller('plain')
class PlainController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  @Post()
  create() {
    return { n: this.counts.hit('plain') };
  }

  @Post('marked')
  @Idempotent({ required: true })
  marked(@IdempotencyKey() key: string | undefined) {
    return { n: this.counts.hit('plain-marked'), key: key ?? null };
  }

  @Post('key')
  key(@IdempotencyKey() key: string | undefined) {
    return { key: key ?? null };
  }
}

@Controller('class')
@Idempotent({ required: true })
class MarkedController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  @Post()
  create() {
    return { n: this.counts.hit('class') };
  }

  @Post('module-options')
  @Idempotent()
  moduleOptions() {
    return { n: this.counts.hit('class-module-options') };
  }

  @Post('out')
  @Idempotent(false)
  out(@IdempotencyKey() key: string | undefined) {
    return { n: this.counts.hit('class-out'), key: key ?? null };
  }

  @Get()
  list() {
    return { n: this.counts.hit('class-get') };
  }
}

class DomainError extends Error {}

/** A filter of the application's own, with a body and status of its own. */
@Catch(DomainError)
class DomainErrorFilter implements ExceptionFilter {
  catch(error: DomainError, host: ArgumentsHost): void {
    const res = host.switchToHttp().getResponse<PlatformResponse & { send(body: string): unknown }>();
    res.status(422);
    res.header('content-type', 'application/vnd.error+json');
    res.send(JSON.stringify({ domain: error.message }));
  }
}

@Controller('nest')
@Idempotent()
class NestFeaturesController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  @Post('filtered')
  @UseFilters(DomainErrorFilter)
  filtered() {
    this.counts.hit('filtered');
    throw new DomainError('insufficient funds');
  }

  @Post('bad-request')
  badRequest() {
    this.counts.hit('bad-request');
    throw new BadRequestException('amount must be positive');
  }

  @Post('decorated')
  @HttpCode(202)
  @Header('x-custom', 'from @Header')
  @Header('cache-control', 'no-store')
  @Header('set-cookie', 'decorated=1')
  async decorated(@Query('delay') delay: string | undefined) {
    if (delay !== undefined) await sleep(Number(delay));
    return { n: this.counts.hit('decorated'), note: 'accepted ✓' };
  }

  @Post('file')
  @HttpCode(200)
  file(): StreamableFile {
    this.counts.hit('file');
    const bytes = Buffer.from(Array.from({ length: 5000 }, (_, i) => (i * 31) % 256));
    const chunks = [bytes.subarray(0, 2000), bytes.subarray(2000, 4000), bytes.subarray(4000)];
    return new StreamableFile(Readable.from(chunks), {
      type: 'application/pdf',
      disposition: 'attachment; filename="receipt.pdf"',
    });
  }

  @Post('long')
  @HttpCode(200)
  long() {
    return { n: this.counts.hit('long'), text: 'x'.repeat(5000) };
  }

  @Post('raw')
  raw(@Res() res: PlatformResponse & { send(body: string): unknown }) {
    const n = this.counts.hit('raw');
    res.status(201);
    res.header('content-type', 'application/json; charset=utf-8');
    res.header('x-raw', String(n));
    res.send(JSON.stringify({ raw: n }));
  }
}

/** Sets `req.user` from `x-user`, as an authentication guard would. */
@Injectable()
class UserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<IdempotentRequest & { user?: { id: string } }>();
    req.user = { id: String(req.headers['x-user'] ?? 'anonymous') };
    return true;
  }
}

@Controller('guarded')
@UseGuards(UserGuard)
@Idempotent()
class GuardedController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  @Post()
  create() {
    return { n: this.counts.hit('guarded') };
  }
}

/** Counts what reaches Nest's exception layer, to prove replays and problem answers never get there. */
@Catch()
class CountingFilter implements ExceptionFilter {
  constructor(private readonly counts: Counts) {}
  catch(error: Error, host: ArgumentsHost): void {
    this.counts.hit('filter');
    const res = host.switchToHttp().getResponse<PlatformResponse & { send(body: string): unknown }>();
    res.status(500);
    res.send(String(error.message));
  }
}

/** Registers the platform's usual compression the way an application does it in main.ts, before app.init(). */
async function useCompression(platform: Platform, app: INestApplication): Promise<void> {
  if (platform === 'express') {
    app.use(compression());
  } else {
    await (app as INestApplication & { register(plugin: object): Promise<unknown> }).register(
      fastifyCompress,
    );
  }
}

interface FastifyLike {
  addHook(
    name: 'preValidation',
    hook: (req: IdempotentRequest & { user?: { id: string } }) => Promise<void>,
  ): void;
}

/** Refuses a key's first request with a 429, as @nestjs/throttler would, and lets every later one through. */
@Injectable()
class FirstRequestThrottled implements CanActivate {
  readonly #seen = new Set<string>();
  canActivate(context: ExecutionContext): boolean {
    const key = String(context.switchToHttp().getRequest<IdempotentRequest>().headers['idempotency-key']);
    if (this.#seen.has(key)) return true;
    this.#seen.add(key);
    throw new HttpException('slow down', 429);
  }
}

/** Nest's documented timeout interceptor: rxjs timeout(), mapped to a 408. */
@Injectable()
class TimeoutInterceptor implements NestInterceptor {
  intercept(_context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(100),
      catchError((error: unknown) =>
        throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error)),
      ),
    );
  }
}

/** A global timeout around every request, outside oncely's interceptor; counts the requests it saw finish. */
@Injectable()
class OuterTimeout implements NestInterceptor {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}
  intercept(_context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(timeout(150), tap({ complete: () => void this.counts.hit('outer-complete') }));
  }
}

@Controller('edge')
@Idempotent()
class EdgeCasesController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  @Post('throttled')
  @UseGuards(FirstRequestThrottled)
  throttled() {
    return { n: this.counts.hit('throttled') };
  }

  @Post('slow-observable')
  @Idempotent({ lockTimeout: '300ms' })
  slowObservable() {
    this.counts.hit('slow-observable');
    return timer(400).pipe(map(() => ({ done: true })));
  }

  @Post('timed-out')
  @UseInterceptors(TimeoutInterceptor)
  async timedOut() {
    this.counts.hit('timed-out-started');
    await sleep(300);
    return { n: this.counts.hit('timed-out') };
  }

  @Post('file-fails')
  @HttpCode(200)
  fileFails(): StreamableFile {
    const n = this.counts.hit('file-fails');
    async function* chunks() {
      yield Buffer.from('chunk-one;');
      if (n === 1) throw new Error('disk gone');
      yield Buffer.from('chunk-two');
    }
    return new StreamableFile(Readable.from(chunks()), { type: 'application/octet-stream' });
  }

  /** Answers once its client has left, with a stream nothing has read yet. */
  @Post('file-after-leaving')
  @HttpCode(200)
  async fileAfterLeaving(@Res({ passthrough: true }) res: { raw?: ServerResponse }): Promise<StreamableFile> {
    // Only the first run waits: a second one (a retry let through) answers at once.
    if (this.counts.hit('file-after-leaving') === 1) await once(res.raw ?? (res as ServerResponse), 'close');
    const chunks = [Buffer.from('chunk-one;'), Buffer.from('chunk-two')];
    return new StreamableFile(Readable.from(chunks), { type: 'application/octet-stream' });
  }

  @Sse('events')
  events() {
    this.counts.hit('events');
    return timer(10).pipe(map(() => ({ data: 'tick' })));
  }
}

abstract class CrudBase {
  @Post('create')
  create() {
    return { created: true };
  }
}

@Controller('a')
@Idempotent()
class FirstCrudController extends CrudBase {}

@Controller('b')
@Idempotent()
class SecondCrudController extends CrudBase {}

const controllers = [PlainController, MarkedController, NestFeaturesController, GuardedController];

describe.each(['express', 'fastify'] as const)('@oncely/nestjs on %s', (platform: Platform) => {
  const apps: TestApp[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });
  const start = async (
    module: ReturnType<typeof IdempotencyModule.forRoot>,
    counts: Counts = routeCounts(),
    filters: ExceptionFilter[] = [],
    setup?: (app: INestApplication) => Promise<void>,
  ) => {
    const app = await serveNest(
      platform,
      { imports: [module], controllers, providers: [{ provide: COUNTS, useValue: counts }] },
      counts.count,
      (nest) => {
        if (filters.length > 0) nest.useGlobalFilters(...filters);
        return setup?.(nest);
      },
    );
    apps.push(app);
    return app;
  };
  const post = (app: TestApp, path: string, key?: string) => {
    const req = request(app.url).post(path);
    return key === undefined ? req.send({}) : req.set('Idempotency-Key', key).send({});
  };

  describe('forRoot and forRootAsync', () => {
    test('forRootAsync: the factory gets what inject names, from a module in imports', async () => {
      const OPTIONS_SOURCE = Symbol('options source');
      const store = new MemoryStore();
      @Module({
        providers: [{ provide: OPTIONS_SOURCE, useValue: { store, header: 'X-Retry-Key' } }],
        exports: [OPTIONS_SOURCE],
      })
      class SettingsModule {}
      const given: unknown[] = [];
      const app = await start(
        IdempotencyModule.forRootAsync({
          imports: [SettingsModule],
          inject: [OPTIONS_SOURCE],
          useFactory: async (source: IdempotencyModuleOptions): Promise<IdempotencyModuleOptions> => {
            given.push(source);
            return { ...source, global: true };
          },
        }),
      );
      expect(given).toHaveLength(1);
      expect((given[0] as IdempotencyModuleOptions).store).toBe(store);
      const key = newKey();
      await request(app.url).post('/plain').set('X-Retry-Key', key).send({}).expect(201);
      const replay = await request(app.url).post('/plain').set('X-Retry-Key', key).send({});
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(app.count('plain')).toBe(1);
      // The record is in the store the factory was given.
      expect(store.size).toBeGreaterThan(0);
    });

    test('wrong module options fail at startup, naming the option', async () => {
      await expect(start(IdempotencyModule.forRoot({ ttl: 'forever' as never }))).rejects.toThrow(
        /option "ttl"/,
      );
      await expect(
        start(IdempotencyModule.forRoot({ global: 'yes' } as unknown as IdempotencyModuleOptions)),
      ).rejects.toThrow(/option "global"/);
      await expect(
        start(IdempotencyModule.forRoot({ golbal: true } as unknown as IdempotencyModuleOptions)),
      ).rejects.toThrow(/option "golbal" is not an oncely option/);
    });

    test('forRootAsync: a factory that returns nothing fails at startup, naming useFactory', async () => {
      await expect(
        start(
          IdempotencyModule.forRootAsync({
            // A block body without its return: the mistake this guards against.
            useFactory: (() => {}) as unknown as () => IdempotencyModuleOptions,
          }),
        ),
      ).rejects.toThrow(
        /option "useFactory" must return the options object \(or \{\}\); it returned undefined/,
      );
    });

    test('scopeByHeader, exported by @oncely/nestjs, isolates API keys', async () => {
      @Controller('api-keys')
      class ApiKeyController {
        runs = 0;
        @Post('charges')
        @Idempotent({ required: true })
        charge() {
          return { run: ++this.runs };
        }
      }
      const counts = routeCounts();
      const app = await serveNest(
        platform,
        {
          imports: [
            IdempotencyModule.forRoot({
              scope: scopeByHeader('x-api-key', { secret: 'adapter-test-secret-0123456789' }),
            }),
          ],
          controllers: [ApiKeyController],
        },
        counts.count,
      );
      apps.push(app);
      const key = newKey();
      const send = (apiKey: string) =>
        request(app.url)
          .post('/api-keys/charges')
          .set('Idempotency-Key', key)
          .set('x-api-key', apiKey)
          .send({});
      expect((await send('k1')).body).toEqual({ run: 1 });
      expect((await send('k2')).body).toEqual({ run: 2 });
      const again = await send('k1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toEqual({ run: 1 });
    });

    test('an option given as undefined in @Idempotent() inherits the module’s (scope, store, observers), as on both platforms', async () => {
      const store = new MemoryStore();
      const decisions: string[] = [];
      @Controller('inherit')
      class InheritController {
        @Post('scoped')
        @Idempotent({ required: true, scope: undefined, store: undefined })
        scoped(@Req() req: { headers: Record<string, string> }) {
          return { user: req.headers['x-user'] };
        }
        @Post('observed')
        @Idempotent({
          [OBSERVERS]: [{ onDecision: (event: { outcome: string }) => decisions.push(event.outcome) }],
        })
        observed() {
          return {};
        }
      }
      const counts = routeCounts();
      const app = await serveNest(
        platform,
        {
          imports: [
            IdempotencyModule.forRoot({
              store,
              scope: (req) => `user:${String((req.headers as Record<string, unknown>)['x-user'])}`,
            }),
          ],
          controllers: [InheritController],
        },
        counts.count,
      );
      apps.push(app);
      const key = newKey();
      const alice = await request(app.url)
        .post('/inherit/scoped')
        .set('Idempotency-Key', key)
        .set('x-user', 'alice')
        .send({});
      const bob = await request(app.url)
        .post('/inherit/scoped')
        .set('Idempotency-Key', key)
        .set('x-user', 'bob')
        .send({});
      expect(alice.body).toEqual({ user: 'alice' });
      // The module's scope kept the two users apart: bob's request ran, it is not alice's replay.
      expect(bob.headers['idempotent-replayed']).toBeUndefined();
      expect(bob.body).toEqual({ user: 'bob' });
      // And the records are in the module's store, which other processes share.
      expect(store.size).toBe(2);
      // A mark made only of a symbol key (what ...otel() gives) is the route's own.
      // With its x-user: the module's scope refuses a request it would put in `user:undefined`.
      const observed = () =>
        request(app.url)
          .post('/inherit/observed')
          .set('Idempotency-Key', key)
          .set('x-user', 'carol')
          .send({});
      await observed().expect(201);
      await observed().expect(201);
      expect(decisions).toEqual(['executed', 'replayed']);
    });

    test("a handler's wrong @Idempotent() options fail at startup, naming the option and the handler", async () => {
      @Controller('broken')
      class BrokenController {
        @Post()
        @Idempotent({ maxKeyLength: -1 })
        create() {
          return {};
        }
      }
      const counts = routeCounts();
      await expect(
        serveNest(
          platform,
          { imports: [IdempotencyModule.forRoot()], controllers: [BrokenController] },
          counts.count,
        ),
      ).rejects.toThrow(/option "maxKeyLength".*BrokenController\.create/);
    });
  });

  describe('opt-in: @Idempotent on a controller or a handler (global: false, the default)', () => {
    test('an unmarked handler is not covered, key or not', async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      await post(app, '/plain', key).expect(201);
      const second = await post(app, '/plain', key).expect(201);
      expect(second.headers['idempotent-replayed']).toBeUndefined();
      expect(app.count('plain')).toBe(2);
      const keyed = await post(app, '/plain/key', key);
      expect(keyed.body).toEqual({ key: null });
    });

    // A client that leaves while the store is asked: the shared suite's, on both platforms (http-*.test.ts).
    test("a marked handler is covered with its own options over the module's", async () => {
      const app = await start(IdempotencyModule.forRoot());
      const missing = await post(app, '/plain/marked');
      expect(missing.status).toBe(400);
      expect(missing.body.type).toBe('https://oncely.dev/problems/key-missing');
      const key = newKey();
      const first = await post(app, '/plain/marked', `"${key}"`).expect(201);
      expect(first.body).toEqual({ n: 1, key });
      const replay = await post(app, '/plain/marked', key);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.text).toBe(first.text);
      expect(app.count('plain-marked')).toBe(1);
    });

    test("a marked controller covers its POST handlers; a handler's mark wins over the controller's", async () => {
      const app = await start(IdempotencyModule.forRoot());
      // The controller's options: required.
      await post(app, '/class').expect(400);
      const key = newKey();
      await post(app, '/class', key).expect(201);
      expect((await post(app, '/class', key)).headers['idempotent-replayed']).toBe('true');
      expect(app.count('class')).toBe(1);
      // @Idempotent() on the handler: the module's options (not required), still covered.
      await post(app, '/class/module-options').expect(201);
      const other = newKey();
      await post(app, '/class/module-options', other).expect(201);
      expect((await post(app, '/class/module-options', other)).headers['idempotent-replayed']).toBe('true');
      expect(app.count('class-module-options')).toBe(2);
      // @Idempotent(false): out, key or not, and the key is not given to the handler.
      const out = newKey();
      const first = await post(app, '/class/out', out).expect(201);
      expect(first.body).toEqual({ n: 1, key: null });
      expect((await post(app, '/class/out', out)).headers['idempotent-replayed']).toBeUndefined();
      expect(app.count('class-out')).toBe(2);
      // GET is not a covered method.
      await request(app.url).get('/class').set('Idempotency-Key', key).expect(200);
      await request(app.url).get('/class').set('Idempotency-Key', key).expect(200);
      expect(app.count('class-get')).toBe(2);
    });
  });

  describe('global: true', () => {
    test('covers every POST, including unmarked handlers; @Idempotent(false) opts out', async () => {
      const app = await start(IdempotencyModule.forRoot({ global: true }));
      const key = newKey();
      await post(app, '/plain', key).expect(201);
      const replay = await post(app, '/plain', key);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(app.count('plain')).toBe(1);
      const keyed = await post(app, '/plain/key', key);
      expect(keyed.status).toBe(422); // same key, another path: the one store knows it
      const own = newKey();
      expect((await post(app, '/plain/key', own)).body).toEqual({ key: own });
      const out = newKey();
      await post(app, '/class/out', out).expect(201);
      await post(app, '/class/out', out).expect(201);
      expect(app.count('class-out')).toBe(2);
    });
  });

  describe('answers made by Nest', () => {
    test("an application exception filter's answer is sent, not stored, and the key is released", async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const first = await post(app, '/nest/filtered', key);
      expect(first.status).toBe(422);
      expect(first.headers['content-type']).toMatch(/^application\/vnd\.error\+json/);
      expect(JSON.parse(first.text)).toEqual({ domain: 'insufficient funds' });
      const retry = await post(app, '/nest/filtered', key);
      expect(retry.status).toBe(422);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(app.count('filtered')).toBe(2);
    });

    test("an HttpException answered by Nest's own filter (400) is not stored either", async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const first = await post(app, '/nest/bad-request', key);
      expect(first.status).toBe(400);
      expect(first.body.message).toBe('amount must be positive');
      const retry = await post(app, '/nest/bad-request', key);
      expect(retry.status).toBe(400);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(app.count('bad-request')).toBe(2);
    });

    test('@HttpCode and @Header replay byte for byte; Set-Cookie from @Header is not replayed', async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const first = await post(app, '/nest/decorated', key).buffer(true).parse(binaryParser);
      expect(first.status).toBe(202);
      expect(first.headers['x-custom']).toBe('from @Header');
      expect(first.headers['set-cookie']).toEqual(['decorated=1']);
      const replay = await post(app, '/nest/decorated', key).buffer(true).parse(binaryParser);
      expect(replay.status).toBe(202);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['x-custom']).toBe('from @Header');
      expect(replay.headers['cache-control']).toBe('no-store');
      expect(replay.headers['content-type']).toBe(first.headers['content-type']);
      expect(replay.headers['set-cookie']).toBeUndefined();
      expect(Buffer.compare(replay.body as Buffer, first.body as Buffer)).toBe(0);
      expect(JSON.parse((first.body as Buffer).toString('utf8'))).toEqual({ n: 1, note: 'accepted ✓' });
      expect(app.count('decorated')).toBe(1);
    });

    test("a 409 while the first runs carries none of the handler's @Header headers", async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const first = post(app, '/nest/decorated?delay=300', key).then((r) => r);
      await sleep(100);
      const conflict = await post(app, '/nest/decorated?delay=300', key);
      expect(conflict.status).toBe(409);
      expect(conflict.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(conflict.headers['x-custom']).toBeUndefined();
      expect(conflict.headers['set-cookie']).toBeUndefined();
      expect((await first).status).toBe(202);
      expect(app.count('decorated')).toBe(1);
    });

    test('a streamed StreamableFile replays byte for byte, with its type and disposition', async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const expected = Buffer.from(Array.from({ length: 5000 }, (_, i) => (i * 31) % 256));
      const first = await post(app, '/nest/file', key).buffer(true).parse(binaryParser);
      expect(first.status).toBe(200);
      expect(Buffer.compare(first.body as Buffer, expected)).toBe(0);
      const replay = await post(app, '/nest/file', key).buffer(true).parse(binaryParser);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['content-type']).toBe('application/pdf');
      expect(replay.headers['content-disposition']).toBe('attachment; filename="receipt.pdf"');
      expect(replay.headers['content-length']).toBe('5000');
      expect(Buffer.compare(replay.body as Buffer, expected)).toBe(0);
      expect(app.count('file')).toBe(1);
    });

    test('a handler that answers through @Res() is captured and replayed', async () => {
      const app = await start(IdempotencyModule.forRoot());
      const key = newKey();
      const first = await post(app, '/nest/raw', key);
      expect(first.status).toBe(201);
      expect(first.text).toBe('{"raw":1}');
      const replay = await post(app, '/nest/raw', key);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['x-raw']).toBe('1');
      expect(replay.text).toBe('{"raw":1}');
      expect(app.count('raw')).toBe(1);
    });

    test("replays and problem answers never reach Nest's exception layer", async () => {
      const counts = routeCounts();
      const app = await start(IdempotencyModule.forRoot({ global: true }), counts, [
        new CountingFilter(counts),
      ]);
      const key = newKey();
      await post(app, '/plain', key).expect(201);
      await post(app, '/plain', key).expect(201); // replay
      await request(app.url).post('/plain').set('Idempotency-Key', key).send({ other: 1 }).expect(422);
      await post(app, '/plain', 'a b').expect(400);
      await sleep(50);
      expect(app.count('filter')).toBe(0);
      expect(app.count('plain')).toBe(1);
    });
  });

  describe('ordering', () => {
    test('compression registered in main.ts: the stored body is the uncompressed one, each answer compressed on demand', async () => {
      const app = await start(IdempotencyModule.forRoot(), undefined, [], (nest) =>
        useCompression(platform, nest),
      );
      const key = newKey();
      const first = await post(app, '/nest/long', key).set('Accept-Encoding', 'gzip');
      expect(first.status).toBe(200);
      expect(first.headers['content-encoding']).toBe('gzip');
      expect(first.body).toEqual({ n: 1, text: 'x'.repeat(5000) });
      const identity = await post(app, '/nest/long', key).set('Accept-Encoding', 'identity');
      expect(identity.headers['idempotent-replayed']).toBe('true');
      expect(identity.headers['content-encoding']).toBeUndefined();
      expect(identity.body).toEqual({ n: 1, text: 'x'.repeat(5000) });
      const gzip = await post(app, '/nest/long', key).set('Accept-Encoding', 'gzip');
      expect(gzip.headers['idempotent-replayed']).toBe('true');
      expect(gzip.headers['content-encoding']).toBe('gzip');
      expect(gzip.body).toEqual({ n: 1, text: 'x'.repeat(5000) });
      expect(app.count('long')).toBe(1);
    });
  });

  describe('differences between the platforms (documented in docs/frameworks/nestjs.md)', () => {
    test(`oncely also mounted by hand with another scope: ${platform === 'express' ? 'refused with a 500 naming both' : "the module's options decide (registered nearer the routes)"}; never one user's answer in another's`, async () => {
      const counts = routeCounts();
      const app = await start(
        IdempotencyModule.forRoot({
          global: true,
          scope: (req) => `user:${String((req.headers as Record<string, unknown>)['x-user'])}`,
        }),
        counts,
        [],
        async (nest) => {
          if (platform === 'express') nest.use(idempotency({ scope: false }));
          else
            await (nest.getHttpAdapter().getInstance() as FastifyInstance).register(idempotencyPlugin, {
              scope: false,
            });
        },
      );
      const key = newKey();
      const as = (user: string) =>
        request(app.url).post('/plain').set('x-user', user).set('Idempotency-Key', key).send({});
      const alice = await as('alice');
      const bob = await as('bob');
      expect(bob.headers['idempotent-replayed']).toBeUndefined();
      if (platform === 'express') {
        for (const answer of [alice, bob]) {
          expect(answer.status).toBe(500);
          expect(answer.body.type).toBe('https://oncely.dev/problems/conflicting-registrations');
        }
        expect(counts.count('plain')).toBe(0);
      } else {
        expect(alice.body).toEqual({ n: 1 });
        expect(bob.body).toEqual({ n: 2 });
        expect((await as('alice')).headers['idempotent-replayed']).toBe('true');
      }
    });

    // Express: oncely runs as a global interceptor, after guards, so `scope` sees what a guard set.
    // Fastify: oncely runs in the route's preHandler hook, before Nest's guards, so it does not.
    test(`scope and guards: ${platform === 'express' ? 'scope sees req.user set by a guard' : 'scope runs before guards'}`, async () => {
      const app = await start(
        IdempotencyModule.forRoot({
          scope: (req) => (req as IdempotentRequest & { user?: { id: string } }).user?.id ?? 'no user yet',
        }),
      );
      const key = newKey();
      const alice = await request(app.url)
        .post('/guarded')
        .set('x-user', 'alice')
        .set('Idempotency-Key', key)
        .send({});
      const bob = await request(app.url)
        .post('/guarded')
        .set('x-user', 'bob')
        .set('Idempotency-Key', key)
        .send({});
      expect(alice.status).toBe(201);
      if (platform === 'express') {
        // Two scopes, two records.
        expect(bob.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('guarded')).toBe(2);
      } else {
        // One scope ('no user yet') for both: Bob gets Alice's record. Set the identity before Nest's guards.
        expect(bob.headers['idempotent-replayed']).toBe('true');
        expect(app.count('guarded')).toBe(1);
      }
    });

    if (platform === 'fastify') {
      test('Fastify: an identity set in a preValidation hook is seen by scope', async () => {
        const counts = routeCounts();
        const app = await start(
          IdempotencyModule.forRoot({
            scope: (req) => (req as IdempotentRequest & { user?: { id: string } }).user?.id ?? 'no user yet',
          }),
          counts,
          [],
          async (nest) => {
            const fastify = (
              nest.getHttpAdapter() as unknown as { getInstance(): FastifyLike }
            ).getInstance();
            fastify.addHook('preValidation', async (req: IdempotentRequest & { user?: { id: string } }) => {
              req.user = { id: String(req.headers['x-user'] ?? 'anonymous') };
            });
          },
        );
        const key = newKey();
        await request(app.url).post('/guarded').set('x-user', 'alice').set('Idempotency-Key', key).send({});
        const bob = await request(app.url)
          .post('/guarded')
          .set('x-user', 'bob')
          .set('Idempotency-Key', key)
          .send({});
        expect(bob.headers['idempotent-replayed']).toBeUndefined();
        expect(app.count('guarded')).toBe(2);
      });
    }
  });

  describe('edge cases found in review', () => {
    const startEdge = async (options: IdempotencyModuleOptions = {}, counts: Counts = routeCounts()) => {
      const app = await serveNest(
        platform,
        {
          imports: [IdempotencyModule.forRoot(options)],
          controllers: [EdgeCasesController],
          providers: [{ provide: COUNTS, useValue: counts }, FirstRequestThrottled],
        },
        counts.count,
      );
      apps.push(app);
      return app;
    };

    test('a guard that refuses the first request (a 429): not stored, the retry runs the handler', async () => {
      const app = await startEdge();
      const key = newKey();
      expect((await post(app, '/edge/throttled', key)).status).toBe(429);
      const retry = await post(app, '/edge/throttled', key);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(retry.body).toEqual({ n: 1 });
      expect(app.count('throttled')).toBe(1);
    });

    test('a client that leaves while an Observable handler runs: Nest gives it up, the key is not locked for good', async () => {
      const app = await startEdge();
      const key = newKey();
      const { port } = new URL(app.url);
      const req = httpRequest({
        host: '127.0.0.1',
        port: Number(port),
        method: 'POST',
        path: '/edge/slow-observable',
        headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      });
      req.on('error', () => {});
      req.end('{}');
      await sleep(100);
      req.destroy();
      await sleep(1000);
      const retry = await post(app, '/edge/slow-observable', key);
      expect(retry.status).toBe(201);
      expect(retry.body).toEqual({ done: true });
      expect(app.count('slow-observable')).toBe(2);
    });

    test("a timeout interceptor inside oncely's answers 408: the key is not released while the handler still runs", async () => {
      const app = await startEdge();
      const key = newKey();
      expect((await post(app, '/edge/timed-out', key)).status).toBe(408);
      // The handler is still running: a retry must not start it again.
      expect((await post(app, '/edge/timed-out', key)).status).toBe(409);
      await sleep(400);
      expect(app.count('timed-out')).toBe(1);
      expect((await post(app, '/edge/timed-out', key)).status).toBe(409);
      expect(app.count('timed-out-started')).toBe(1);
    });

    test('a StreamableFile that fails part-way is not stored: the retry runs the handler again', async () => {
      const app = await startEdge();
      const key = newKey();
      await post(app, '/edge/file-fails', key).catch(() => undefined);
      const retry = await post(app, '/edge/file-fails', key).buffer(true).parse(binaryParser);
      expect(retry.status).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect((retry.body as Buffer).toString()).toBe('chunk-one;chunk-two');
      expect(app.count('file-fails')).toBe(2);
    });

    test.each([
      ['below maxBodyBytes', {}],
      ['beyond maxBodyBytes', { maxBodyBytes: 5 }],
    ])(
      'a client that leaves before its handler returns a StreamableFile (%s): settled, its key not held for good',
      async (size, limit) => {
        let renewals = 0;
        const memory = new MemoryStore();
        const store: IdempotencyStore = {
          acquire: (...args) => memory.acquire(...args),
          complete: (...args) => memory.complete(...args),
          release: (...args) => memory.release(...args),
          renew: (...args) => {
            renewals++;
            return memory.renew(...args);
          },
        };
        // Renewed every 100 ms while the lease is held.
        const app = await startEdge({ store, lockTimeout: 300, ...limit });
        const key = newKey();
        const { port } = new URL(app.url);
        const req = httpRequest({
          host: '127.0.0.1',
          port: Number(port),
          method: 'POST',
          path: '/edge/file-after-leaving',
          headers: { 'idempotency-key': key, 'content-type': 'application/json' },
        });
        req.on('error', () => {});
        req.on('response', (res) => res.resume());
        req.end('{}');
        while (app.count('file-after-leaving') === 0) await sleep(5);
        req.destroy();
        // Past the lease: a key still held would be renewed and answer 409.
        await sleep(400);
        const retry = await post(app, '/edge/file-after-leaving', key).buffer(true).parse(binaryParser);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        if (platform === 'express' || size === 'beyond maxBodyBytes') {
          // Nest's reply on Express stops the stream at the closed response before it is read, and a stream too big
          // to keep cannot be sent any more: recorded as executed, without a body.
          expect(retry.status).toBe(410);
          expect(JSON.parse((retry.body as Buffer).toString()).type).toBe(
            'https://oncely.dev/problems/response-not-stored',
          );
        } else {
          // Fastify's adapter reads the stream itself (below maxBodyBytes) and stores the whole answer.
          expect(retry.status).toBe(200);
          expect((retry.body as Buffer).toString()).toBe('chunk-one;chunk-two');
        }
        expect(app.count('file-after-leaving')).toBe(1);
        const renewed = renewals;
        await sleep(400);
        expect(renewals).toBe(renewed);
      },
    );

    test('an @Sse() route is never covered, even marked and with GET among the methods', async () => {
      const app = await startEdge({ methods: ['GET', 'POST'] });
      const key = newKey();
      const first = await request(app.url).get('/edge/events').set('Idempotency-Key', key);
      const second = await request(app.url).get('/edge/events').set('Idempotency-Key', key);
      expect(second.headers['idempotent-replayed']).toBeUndefined();
      expect(first.text).toContain('data: tick');
      expect(app.count('events')).toBe(2);
    });

    test('two controllers marking an inherited handler alike start, and each is covered', async () => {
      const counts = routeCounts();
      const app = await serveNest(
        platform,
        {
          imports: [IdempotencyModule.forRoot()],
          controllers: [FirstCrudController, SecondCrudController],
        },
        counts.count,
      );
      apps.push(app);
      const key = newKey();
      await post(app, '/a/create', key).expect(201);
      expect((await post(app, '/a/create', key)).headers['idempotent-replayed']).toBe('true');
      await post(app, '/b/create', newKey()).expect(201);
    });

    test('app.enableCors(): a replay carries the Access-Control-Allow-Origin of its own origin', async () => {
      const counts = routeCounts();
      const app = await serveNest(
        platform,
        {
          imports: [IdempotencyModule.forRoot({ global: true })],
          controllers: [PlainController],
          providers: [{ provide: COUNTS, useValue: counts }],
        },
        counts.count,
        (nest) => nest.enableCors({ origin: true }),
      );
      apps.push(app);
      const key = newKey();
      const send = (origin: string) =>
        request(app.url).post('/plain').set('Origin', origin).set('Idempotency-Key', key).send({});
      expect((await send('https://a.example')).headers['access-control-allow-origin']).toBe(
        'https://a.example',
      );
      const replay = await send('https://b.example');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['access-control-allow-origin']).toBe('https://b.example');
      expect(app.count('plain')).toBe(1);
    });

    test("a global interceptor outside oncely's: a replay completes it, no late timeout reaches a filter", async () => {
      const counts = routeCounts();
      const filter = new CountingFilter(counts);
      const app = await serveNest(
        platform,
        {
          imports: [IdempotencyModule.forRoot({ global: true })],
          controllers: [PlainController],
          providers: [
            { provide: COUNTS, useValue: counts },
            { provide: APP_INTERCEPTOR, useClass: OuterTimeout },
          ],
        },
        counts.count,
        (nest) => void nest.useGlobalFilters(filter),
      );
      apps.push(app);
      const key = newKey();
      await post(app, '/plain', key).expect(201);
      const replay = await post(app, '/plain', key);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      await sleep(300);
      expect(counts.count('filter')).toBe(0);
      expect(counts.count('plain')).toBe(1);
      // Fastify answers a replay in its preHandler, before Nest's interceptors run at all.
      expect(counts.count('outer-complete')).toBe(platform === 'express' ? 2 : 1);
    });

    test('@Idempotent(true) from JavaScript is refused when the decorator is made', () => {
      expect(() => Idempotent(true as never)).toThrow(/takes options, or false/);
      expect(() => Idempotent(true as never)).toThrow(TypeError);
      expect(() => Idempotent(true as never)).toThrow(OncelyError);
    });
  });
});
