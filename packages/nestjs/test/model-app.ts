import 'reflect-metadata';
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import {
  type ArgumentsHost,
  Catch,
  Controller,
  type ExceptionFilter,
  Header,
  HttpCode,
  type HttpServer,
  Post,
  Req,
  Res,
  StreamableFile,
} from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import {
  delayOf,
  later,
  type ModelApp,
  type ModelAppFactory,
  type ModelRoute,
  modelOptions,
  nextChunk,
  type RunHandle,
} from '@oncely/testing';
import { IdempotencyModule, Idempotent, type IdempotentRequest } from '../src';
import { type Platform, type PlatformResponse, serveNest } from './harness';

/** What both platforms' responses offer, and the Node response under it. */
type NestResponse = PlatformResponse & { raw?: ServerResponse };

/** The model's error handling: `{ error }` with 500, except `/u/bad-status`, whose filter copies a missing status. */
@Catch()
class ModelErrorFilter implements ExceptionFilter {
  constructor(private readonly adapter: HttpServer) {}

  catch(error: Error & { status?: number }, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    if (http.getRequest<{ url?: string }>().url?.startsWith('/u/bad-status')) {
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
    this.adapter.reply(http.getResponse(), { error: error.message }, 500);
  }
}

/**
 * The model app (see ModelRoute in @oncely/testing) as a Nest application on `platform`: the module's options are
 * the public registration (every route, `global: true`), and `@Idempotent(perUser)` marks each `/u` and `/n` handler.
 */
export function nestModelApp(platform: Platform): ModelAppFactory {
  return async (options): Promise<ModelApp> => {
    const { recorder } = options;
    const { appWide, perUser } = modelOptions<IdempotentRequest>(options, (request) => request.headers);
    const begin = (route: ModelRoute, req: IdempotentRequest, res: NestResponse): RunHandle => {
      const body = req.body;
      const run = recorder.begin(
        route,
        req.headers,
        typeof body === 'string' ? body : JSON.stringify(body ?? null),
      );
      run.watch(res.raw ?? (res as unknown as ServerResponse));
      for (const [name, value] of Object.entries(run.headers())) res.header(name, value);
      return run;
    };
    const json = async (route: ModelRoute, status: number, req: IdempotentRequest, res: NestResponse) => {
      const run = begin(route, req, res);
      await later(delayOf(req.headers));
      const body = run.json();
      run.answer(status, 'application/json', body);
      res.status(status);
      return JSON.parse(body.toString()) as unknown;
    };

    @Controller()
    class ModelController {
      @Post('p/json')
      pJson(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        return json('/p/json', 201, req, res);
      }

      @Post('p/text')
      @HttpCode(201)
      @Header('content-type', 'text/plain')
      async pText(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        const run = begin('/p/text', req, res);
        await later(delayOf(req.headers));
        const body = run.text();
        run.answer(201, 'text/plain', body);
        return body.toString();
      }

      @Post('n/json')
      @Idempotent(perUser)
      nJson(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        return json('/n/json', 201, req, res);
      }

      @Post('u/json')
      @Idempotent(perUser)
      uJson(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        return json('/u/json', 201, req, res);
      }

      @Post('u/fail')
      @Idempotent(perUser)
      uFail(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        return json('/u/fail', 503, req, res);
      }

      @Post('u/teapot')
      @Idempotent(perUser)
      uTeapot(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        return json('/u/teapot', 418, req, res);
      }

      @Post('u/throw')
      @Idempotent(perUser)
      uThrow(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse): never {
        const run = begin('/u/throw', req, res);
        run.handed();
        throw new Error('the handler threw');
      }

      @Post('u/reject')
      @Idempotent(perUser)
      async uReject(
        @Req() req: IdempotentRequest,
        @Res({ passthrough: true }) res: NestResponse,
      ): Promise<never> {
        const run = begin('/u/reject', req, res);
        await later(delayOf(req.headers));
        run.handed();
        throw new Error('the handler failed later');
      }

      @Post('u/bad-status')
      @Idempotent(perUser)
      async uBadStatus(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        const run = begin('/u/bad-status', req, res);
        await later(delayOf(req.headers));
        run.handed();
        // An error without a status, for the filter above to copy.
        throw new Error('no status');
      }

      @Post('u/stream')
      @Idempotent(perUser)
      @HttpCode(200)
      async uStream(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        const run = begin('/u/stream', req, res);
        await later(delayOf(req.headers));
        const chunks = run.streamChunks();
        run.answer(200, 'application/octet-stream', Buffer.concat(chunks), true);
        const source = Readable.from(
          (async function* () {
            for (const chunk of chunks) {
              await nextChunk();
              yield chunk;
            }
            run.handed();
          })(),
        );
        source.on('close', () => run.handed());
        return new StreamableFile(source);
      }

      @Post('u/buffer')
      @Idempotent(perUser)
      @HttpCode(200)
      async uBuffer(@Req() req: IdempotentRequest, @Res({ passthrough: true }) res: NestResponse) {
        const run = begin('/u/buffer', req, res);
        await later(delayOf(req.headers));
        const buffer = run.fill(recorder.pool.take());
        run.answer(200, 'application/octet-stream', buffer);
        (res.raw ?? (res as unknown as ServerResponse)).once('close', () => recorder.pool.give(buffer));
        return new StreamableFile(buffer);
      }
    }

    return serveNest(
      platform,
      {
        imports: [IdempotencyModule.forRoot({ ...appWide, global: true })],
        controllers: [ModelController],
      },
      () => 0,
      (app) => {
        app.useGlobalFilters(new ModelErrorFilter(app.getHttpAdapter()));
        // Express's platform parses JSON and forms only: text bodies too, before oncely, as the docs ask.
        if (platform === 'express') (app as NestExpressApplication).useBodyParser('text');
      },
    );
  };
}
