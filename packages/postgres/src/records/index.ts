/**
 * How `PostgresStore` lays out its records table, and a decoder for its rows, for tools that read
 * records themselves (the `oncely` command's inspect, list and stats). An app does not need it.
 *
 * @module @oncely/postgres/records
 */
export { type DecodedRow, decodeRecord } from '../rows';
export { DEFAULT_SCHEMA, DEFAULT_TABLE, type RecordsLayout, recordsLayout } from '../sql';
