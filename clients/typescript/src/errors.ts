/**
 * Errors of the cellhost HTTP API as one typed exception.
 *
 * Every error answer of the server is `{"error": {"code", "message", ...fields}}`
 * (application/json) with the HTTP status that follows from the code;
 * {@link CellhostError} keeps all of it.
 */

import type { components } from "./schema.js";

/** The server's stable error codes (`ErrorCode` of the OpenAPI document). */
export type ErrorCode = components["schemas"]["ErrorCode"];

/**
 * Codes the client gives itself when there is no server answer to carry:
 * `host_unavailable` (the server could not be reached) and `bad_response`
 * (an answer that is not what the document says, e.g. not JSON).
 */
export type ClientErrorCode = "host_unavailable" | "bad_response";

/** A request failed: `code` is the server's stable code (or a client code). */
export class CellhostError extends Error {
  /** The stable code, e.g. `session_not_found`, `session_busy`, `file_not_found`. */
  readonly code: ErrorCode | ClientErrorCode;
  /** The HTTP status (0 when there was no HTTP answer, or for an `error` event of a stream). */
  readonly status: number;
  /** The envelope's other fields a caller can act on (`session`, `cell`, `limit`, ...). */
  readonly fields: Readonly<Record<string, unknown>>;

  constructor(
    code: ErrorCode | ClientErrorCode,
    message: string,
    status = 0,
    fields: Record<string, unknown> = {},
  ) {
    super(`${code}: ${message}`);
    this.name = "CellhostError";
    this.code = code;
    this.status = status;
    this.fields = fields;
  }

  /**
   * The error of an answer's envelope (`body` parsed JSON, or text when the
   * answer was not JSON).
   */
  static fromEnvelope(status: number, body: unknown): CellhostError {
    const err =
      body !== null && typeof body === "object" ? (body as { error?: unknown }).error : undefined;
    if (err === null || typeof err !== "object") {
      const text = typeof body === "string" ? body : JSON.stringify(body);
      return new CellhostError("bad_response", `HTTP ${status}: ${String(text).slice(0, 500)}`, status);
    }
    const { code, message, ...fields } = err as Record<string, unknown>;
    return new CellhostError(
      (typeof code === "string" ? code : "bad_response") as ErrorCode,
      typeof message === "string" ? message : "",
      status,
      fields,
    );
  }
}
