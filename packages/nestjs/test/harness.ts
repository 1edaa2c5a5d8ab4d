import 'reflect-metadata';
import { Readable } from 'node:stream';
import {
  type ArgumentsHost,
  Body,
  Catch,
  Controller,
  Delete,
  type ExceptionFilter,
  Get,
  Header,
  HttpCode,
  type HttpServer,
  type INestApplication,
  Inject,
  Param,
  Patch,
  Post,
  Put,
  Query,
  Req,
  Res,
  StreamableFile,
} from '@nestjs/common';
import type { AbstractHttpAdapter } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import type { IdempotencyContext } from '@oncely/core';
import {
  type AdapterHarness,
  expectedBinary,
  expectedStream,
  pipeParams,
  pipeSource,
  reusedBuffer,
  routeCounts,
  serveTestApp,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
} from '@oncely/testing';
import { IdempotencyKey, IdempotencyModule, type IdempotencyModuleOptions, Idempotent } from '../src';

export type Platform = 'express' | 'fastify';

/** The suite's route counter, given to the controllers. */
export const COUNTS = Symbol('counts');
type Counts = ReturnType<typeof routeCounts>;

/** What both platforms' responses offer (Express `Response`, `FastifyReply`). */
export interface PlatformResponse {
  status(code: number): unknown;
  header(name: string, value: string): unknown;
}

interface ChargeBody {
  amount?: number;
}

const later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The suite's routes (see TestApp in @oncely/testing) as one Nest controller. */
@Controller()
export class SuiteController {
  constructor(@Inject(COUNTS) private readonly counts: Counts) {}

  async #charge(
    status: number,
    body: ChargeBody | undefined,
    delay: string | undefined,
    res: PlatformResponse,
  ) {
    const n = this.counts.hit('charges');
    if (Number(delay ?? 0) > 0) await later(Number(delay));
    res.status(status);
    res.header('x-charge-id', String(n));
    res.header('set-cookie', `session=${n}`);
    return { id: n, amount: body?.amount ?? null };
  }

  @Get('charges')
  get(@Query('delay') delay: string | undefined, @Res({ passthrough: true }) res: PlatformResponse) {
    return this.#charge(200, undefined, delay, res);
  }

  @Delete('charges')
  delete(@Query('delay') delay: string | undefined, @Res({ passthrough: true }) res: PlatformResponse) {
    return this.#charge(200, undefined, delay, res);
  }

  @Post('charges')
  post(
    @Body() body: ChargeBody | undefined,
    @Query('delay') delay: string | undefined,
    @Res({ passthrough: true }) res: PlatformResponse,
  ) {
    return this.#charge(201, body, delay, res);
  }

  @Put('charges')
  put(
    @Body() body: ChargeBody | undefined,
    @Query('delay') delay: string | undefined,
    @Res({ passthrough: true }) res: PlatformResponse,
  ) {
    return this.#charge(201, body, delay, res);
  }

  @Patch('charges')
  patch(
    @Body() body: ChargeBody | undefined,
    @Query('delay') delay: string | undefined,
    @Res({ passthrough: true }) res: PlatformResponse,
  ) {
    return this.#charge(201, body, delay, res);
  }

  @Post('status/:code')
  async status(
    @Param('code') code: string,
    @Query('delay') delay: string | undefined,
    @Res({ passthrough: true }) res: PlatformResponse,
  ) {
    const n = this.counts.hit('status');
    if (Number(delay ?? 0) > 0) await later(Number(delay));
    res.status(Number(code));
    return code === '204' ? undefined : { n };
  }

  @Post('throw')
  throw(@Query('status') status: string | undefined): never {
    this.counts.hit('throw');
    throw Object.assign(new Error('boom'), status ? { status: Number(status) } : {});
  }

  @Post('reject')
  async reject(): Promise<never> {
    this.counts.hit('reject');
    await new Promise((resolve) => setImmediate(resolve));
    throw new Error('async boom');
  }

  @Post('binary')
  @HttpCode(200)
  binary(): StreamableFile {
    this.counts.hit('binary');
    return new StreamableFile(expectedBinary());
  }

  @Post('stream')
  @HttpCode(200)
  stream(): StreamableFile {
    this.counts.hit('stream');
    const body = expectedStream();
    return new StreamableFile(
      Readable.from(
        (async function* () {
          for (let i = 0; i < 10; i++) {
            await new Promise((resolve) => setImmediate(resolve));
            yield body.subarray(i * 1000, (i + 1) * 1000);
          }
        })(),
      ),
    );
  }

  @Post('big')
  @HttpCode(200)
  @Header('content-type', 'text/plain; charset=utf-8')
  big(@Query('size') size: string): string {
    this.counts.hit('big');
    return 'x'.repeat(Number(size));
  }

  @Post('text')
  @HttpCode(200)
  @Header('content-type', 'text/plain; charset=utf-8')
  text(): string {
    this.counts.hit('text');
    return 'héllo wörld ✓';
  }

  @Post('key')
  key(@IdempotencyKey() key: string | undefined) {
    return { key: key ?? null };
  }

  @Post('bad-status')
  badStatus(@Query('in') where: string | undefined, @Res({ passthrough: true }) res: PlatformResponse) {
    this.counts.hit('bad-status');
    // Express 5's res.status() and Fastify's reply.status() refuse it (they throw).
    if (where === 'handler') res.status(undefined as unknown as number);
    else throw new Error('no status');
    return {};
  }

  @Post('pipe')
  @HttpCode(200)
  pipe(
    @Query('chunks') chunks: string | undefined,
    @Query('every') every: string | undefined,
    @Query('fail') fail: string | undefined,
  ): StreamableFile {
    this.counts.hit('pipe');
    const params = pipeParams({ chunks, every, fail });
    return new StreamableFile(pipeSource(params.chunks, params.every, params.fail));
  }

  @Post('reused')
  @HttpCode(200)
  reused(): StreamableFile {
    this.counts.hit('reused');
    return new StreamableFile(reusedBuffer());
  }

  @Post('steps')
  async steps(
    @Req() req: { idempotency?: IdempotencyContext },
    @Query() query: Record<string, unknown>,
    @Res({ passthrough: true }) res: PlatformResponse,
  ) {
    const answer = await stepsRoute(req.idempotency, query, (route) => this.counts.hit(route));
    res.status(answer.status);
    return answer.body;
  }
}

/** The suite's error handler: `err.status ?? 500` with JSON `{ error }`, written through the platform. */
@Catch()
export class SuiteErrorFilter implements ExceptionFilter {
  constructor(private readonly adapter: HttpServer) {}

  catch(error: Error & { status?: number; getStatus?: () => number }, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    if (http.getRequest<{ url?: string }>().url?.startsWith('/bad-status')) {
      // A hand-written filter that trusts every error to carry a status, on the platform's own response.
      const response = http.getResponse<{
        code?: (status: number) => { send(body: unknown): void };
        statusCode: number;
        json(body: unknown): void;
      }>();
      if (typeof response.code === 'function')
        response.code(error.status as number).send({ error: error.message });
      else {
        response.statusCode = error.status as number;
        response.json({ error: error.message });
      }
      return;
    }
    const status = error.getStatus?.() ?? error.status ?? 500;
    this.adapter.reply(host.switchToHttp().getResponse(), { error: error.message }, status);
  }
}

export function platformAdapter(platform: Platform): AbstractHttpAdapter {
  return platform === 'express' ? new ExpressAdapter() : new FastifyAdapter();
}

/** A Nest application on `platform` with these modules, controllers and providers, listening on 127.0.0.1. */
export async function serveNest(
  platform: Platform,
  metadata: Parameters<typeof Test.createTestingModule>[0],
  count: (route: string) => number,
  setup?: (app: INestApplication) => void | Promise<void>,
): Promise<TestApp & { app: INestApplication }> {
  const moduleRef = await Test.createTestingModule(metadata).compile();
  const app = moduleRef.createNestApplication(platformAdapter(platform), { logger: false });
  await setup?.(app);
  await app.init();
  if (platform === 'fastify')
    await (app.getHttpAdapter() as AbstractHttpAdapter).getInstance<{ ready(): Promise<unknown> }>().ready();
  const served = await serveTestApp(app.getHttpServer(), count);
  return {
    ...served,
    app,
    close: async () => {
      await served.close();
      await app.close();
    },
  };
}

/** The suite's routes on a Nest application on `platform`, every POST/PUT/PATCH covered (`global: true`). */
export function nestHarness(name: string, platform: Platform): AdapterHarness {
  const harness: AdapterHarness & {
    create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
  } = {
    name,
    // A handler's @Idempotent() options are over the module's: the nearest decides.
    nested: { rule: 'nearest', create: (outer, inner) => harness.create(outer, inner) },
    // With `inner`, the POST /charges handler is marked @Idempotent(inner) (the suite's nested registrations).
    async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
      const counts = routeCounts();
      const moduleOptions: IdempotencyModuleOptions = { ...options, global: true };
      return serveNest(
        platform,
        {
          imports: [IdempotencyModule.forRoot(moduleOptions)],
          controllers: [inner === undefined ? SuiteController : markedCharges(inner)],
          providers: [{ provide: COUNTS, useValue: counts }],
        },
        counts.count,
        (app) => {
          app.useGlobalFilters(new SuiteErrorFilter(app.getHttpAdapter()));
        },
      );
    },
  };
  return harness;
}

/** The suite's controller with its POST /charges handler marked `@Idempotent(inner)`. */
function markedCharges(inner: TestAppOptions): typeof SuiteController {
  @Controller()
  class MarkedSuiteController extends SuiteController {
    @Post('charges')
    @Idempotent(inner)
    override post(
      @Body() body: ChargeBody | undefined,
      @Query('delay') delay: string | undefined,
      @Res({ passthrough: true }) res: PlatformResponse,
    ) {
      return super.post(body, delay, res);
    }
  }
  return MarkedSuiteController;
}
