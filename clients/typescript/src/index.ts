/**
 * `@cellhost/client`: a TypeScript client of the cellhost HTTP API.
 *
 * ```ts
 * import { CellhostClient } from "@cellhost/client";
 * const c = new CellhostClient({ baseUrl: "http://127.0.0.1:8787", token });
 * await c.createSession({ name: "a" });
 * const r = await c.execute("a", "6 * 7");   // r.result?.["text/plain"] === "42"
 * ```
 *
 * `paths`, `components` and `operations` are the types generated from the
 * server's OpenAPI document (`src/schema.ts`, `npm run generate`).
 */

export * from "./client.js";
export { CellhostError } from "./errors.js";
export type { ErrorCode, ClientErrorCode } from "./errors.js";
export { readEvents } from "./sse.js";
export type { RawEvent } from "./sse.js";
export type { paths, components, operations } from "./schema.js";
