// dynalite 4 ships no type declarations: the parts the tests use.
declare module 'dynalite' {
  import type { Server } from 'node:http';

  interface DynaliteOptions {
    createTableMs?: number;
    deleteTableMs?: number;
    updateTableMs?: number;
    maxItemSizeKb?: number;
    path?: string;
  }
  function dynalite(options?: DynaliteOptions): Server;
  export = dynalite;
}
