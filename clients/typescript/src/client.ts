/**
 * A typed client of the cellhost HTTP API over `fetch`.
 *
 * Request and answer types are those of `schema.ts`, generated from the
 * OpenAPI document the server serves at `/openapi.json`
 * (`npm run generate`); the method names follow its `operationId`s.
 */

import type { components, operations } from "./schema.js";
import { CellhostError } from "./errors.js";
import { readEvents } from "./sse.js";

type S = components["schemas"];
/** The result of one cell (`CellResult`). */
export type CellResult = S["CellResult"];
/** A session of the caller (`SessionInfo`). */
export type SessionInfo = S["SessionInfo"];
/** Body of `POST /v1/sessions` (`CreateSession`). */
export type CreateSession = S["CreateSession"];
/** Body of `POST /v1/sessions/{name}/execute` (`ExecuteRequest`). */
export type ExecuteRequest = S["ExecuteRequest"];
/** How images of a result come back: `url`, `inline` or `none`. */
export type ImagesMode = S["ImagesMode"];
/** The handle of a submitted cell (`Submitted`). */
export type Submitted = S["Submitted"];
/** A snapshot of a submitted cell (`CellSnapshot`). */
export type CellSnapshot = S["CellSnapshot"];
/** What a cancel did (`CellCancelled`). */
export type CellCancelled = S["CellCancelled"];
/** The queued and running submitted cells of a session (`PendingCells`). */
export type PendingCells = S["PendingCells"];
/** What an interrupt did (`InterruptAnswer`). */
export type InterruptAnswer = S["InterruptAnswer"];
/** A session's namespace (`VariablesAnswer`). */
export type VariablesAnswer = S["VariablesAnswer"];
/** What a file write did (`FileWrittenAnswer`). */
export type FileWritten = S["FileWrittenAnswer"];
/** A directory listing (`FileListingAnswer`). */
export type FileListing = S["FileListingAnswer"];
/** What a file delete removed (`FileDeleted`). */
export type FileDeleted = S["FileDeleted"];
/** Body of `POST /v1/notebooks/run` (`RunNotebookBody`). */
export type RunNotebookBody = S["RunNotebookBody"];
/** Answer of `POST /v1/notebooks/run` (`RunNotebookAnswer`). */
export type RunNotebookAnswer = S["RunNotebookAnswer"];
/** A session's past cells (`HistoryAnswer`). */
export type HistoryAnswer = S["HistoryAnswer"];

/** The `data` of a `stream` event: a piece of the cell's output. */
export interface StreamChunk {
  name: "stdout" | "stderr";
  text: string;
}

/** One event of a streamed `execute`, its data parsed. */
export type ExecuteEvent =
  | { event: "stream"; data: StreamChunk }
  | { event: "display"; data: Record<string, unknown> }
  | { event: "result"; data: CellResult };

/** One event of a submitted cell (`GET /v1/cells/{cell}/events`), its data parsed; `id` is its offset. */
export type CellEvent =
  | { event: "stream"; id: number; data: StreamChunk }
  | { event: "display"; id: number; data: Record<string, unknown> }
  | { event: "result"; id: number; data: CellResult }
  | { event: "error"; id: number; data: { code: string; message: string; [k: string]: unknown } }
  | { event: "cancelled"; id: number; data: Record<string, unknown> };

/** Options of {@link CellhostClient}. */
export interface ClientOptions {
  /** The server, e.g. `http://127.0.0.1:8787` (no `/v1`). */
  baseUrl: string;
  /** A bearer token of the server's token file (`OWNER TOKEN rw|ro`). */
  token: string;
  /** The `fetch` to use (default: the global one, Node 18+). */
  fetch?: typeof fetch;
}

/** Options of an `execute`. */
export interface ExecuteOptions {
  /** The cell's deadline in seconds (0 = none; absent: the server's `cell_timeout_s`). */
  timeoutS?: number;
  /** How images come back (default `url`). */
  images?: ImagesMode;
  /** Wait behind a running cell instead of failing with `session_busy`. */
  queue?: boolean;
  /** Aborts the HTTP request (the cell itself keeps running: use {@link CellhostClient.interrupt}). */
  signal?: AbortSignal;
}

/** The bytes of a file or display, with the content type the server gave. */
export interface Download {
  bytes: Uint8Array;
  contentType: string;
  /** HTTP status: 200, or 206 for a range. */
  status: number;
}

/** Raw request body of a file write. */
export type FileBody = Uint8Array | ArrayBuffer | Blob | string;

function seg(s: string): string {
  return encodeURIComponent(s);
}

/** A file path relative to the workdir, each segment percent-encoded, `/` kept. */
function filePath(path: string): string {
  return path.split("/").map(seg).join("/");
}

/** A client of one cellhost server (one token, so one owner). */
export class CellhostClient {
  readonly baseUrl: string;
  private readonly token: string;
  private readonly fetchImpl: typeof fetch;

  constructor(opts: ClientOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.token = opts.token;
    this.fetchImpl = opts.fetch ?? globalThis.fetch;
  }

  /** One request; a non-2xx answer is thrown as {@link CellhostError}. */
  private async send(
    method: string,
    path: string,
    init: { json?: unknown; body?: BodyInit; headers?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.token}`, ...init.headers };
    let body: BodyInit | undefined = init.body;
    if (init.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(init.json);
    }
    let resp: Response;
    try {
      resp = await this.fetchImpl(this.baseUrl + path, { method, headers, body, signal: init.signal });
    } catch (e) {
      if (init.signal?.aborted) throw e;
      throw new CellhostError("host_unavailable", `cannot reach ${this.baseUrl}: ${String(e)}`);
    }
    if (!resp.ok) {
      const text = await resp.text();
      let parsed: unknown = text;
      try {
        parsed = JSON.parse(text);
      } catch {
        // not JSON: kept as text
      }
      throw CellhostError.fromEnvelope(resp.status, parsed);
    }
    return resp;
  }

  private async json<T>(method: string, path: string, json?: unknown, signal?: AbortSignal): Promise<T> {
    const resp = await this.send(method, path, { json, signal });
    const text = await resp.text();
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new CellhostError("bad_response", `${method} ${path}: not JSON: ${text.slice(0, 200)}`, resp.status);
    }
  }

  private static sessionPath(name: string): string {
    return `/v1/sessions/${seg(name)}`;
  }

  /** The OpenAPI document the server serves (`GET /openapi.json`, no token needed). */
  async openapi(): Promise<Record<string, unknown>> {
    return this.json("GET", "/openapi.json");
  }

  // --- sessions -----------------------------------------------------------

  /** Creates a session (`createSession`; 409 `session_exists` for a taken name). */
  async createSession(body: CreateSession = {}): Promise<SessionInfo> {
    return this.json("POST", "/v1/sessions", body);
  }

  /** The caller's sessions, by name (`listSessions`). */
  async listSessions(): Promise<SessionInfo[]> {
    const list = await this.json<operations["listSessions"]["responses"][200]["content"]["application/json"]>(
      "GET",
      "/v1/sessions",
    );
    return list.sessions;
  }

  /** Ends a session's kernel and forgets the session (`deleteSession`). */
  async deleteSession(name: string): Promise<void> {
    await this.send("DELETE", CellhostClient.sessionPath(name));
  }

  /** A fresh kernel for the session: its variables are dropped (`restart`). */
  async restart(name: string): Promise<SessionInfo> {
    return this.json("POST", `${CellhostClient.sessionPath(name)}/restart`);
  }

  /** Interrupts the session's running cell (`interrupt`). */
  async interrupt(name: string): Promise<InterruptAnswer> {
    return this.json("POST", `${CellhostClient.sessionPath(name)}/interrupt`);
  }

  /** The session's variables (`variables`; at most `limit`). */
  async variables(name: string, limit?: number): Promise<VariablesAnswer> {
    const q = limit === undefined ? "" : `?limit=${encodeURIComponent(String(limit))}`;
    return this.json("GET", `${CellhostClient.sessionPath(name)}/variables${q}`);
  }

  /** The session's past cells (`history`). */
  async history(name: string): Promise<HistoryAnswer> {
    return this.json("GET", `${CellhostClient.sessionPath(name)}/history`);
  }

  // --- cells --------------------------------------------------------------

  private static executeBody(code: string, opts: ExecuteOptions): ExecuteRequest {
    const body: ExecuteRequest = { code };
    if (opts.timeoutS !== undefined) body.timeout_s = opts.timeoutS;
    if (opts.images !== undefined) body.images = opts.images;
    if (opts.queue !== undefined) body.queue = opts.queue;
    return body;
  }

  /**
   * Runs one cell and answers its result (`execute`). An exception in the
   * cell is `status: "error"` in the result, not a thrown error.
   */
  async execute(name: string, code: string, opts: ExecuteOptions = {}): Promise<CellResult> {
    return this.json(
      "POST",
      `${CellhostClient.sessionPath(name)}/execute`,
      CellhostClient.executeBody(code, opts),
      opts.signal,
    );
  }

  /**
   * Runs one cell and yields its events as they come (`execute` with
   * `?stream=true`): `stream` and `display` events, then one `result`. An
   * `error` event is thrown as {@link CellhostError}.
   */
  async *executeStream(name: string, code: string, opts: ExecuteOptions = {}): AsyncGenerator<ExecuteEvent> {
    const resp = await this.send("POST", `${CellhostClient.sessionPath(name)}/execute?stream=true`, {
      json: CellhostClient.executeBody(code, opts),
      headers: { Accept: "text/event-stream" },
      signal: opts.signal,
    });
    if (resp.body === null) throw new CellhostError("bad_response", "execute: no event stream", resp.status);
    for await (const ev of readEvents(resp.body)) {
      const data = parseData(ev.data);
      if (ev.event === "error") throw CellhostError.fromEnvelope(0, { error: data });
      yield { event: ev.event, data } as ExecuteEvent;
    }
  }

  /** Submits a cell without waiting for it (`submitCell`, 202). */
  async submit(name: string, code: string, opts: { timeoutS?: number } = {}): Promise<Submitted> {
    const body: S["SubmitBody"] = { code };
    if (opts.timeoutS !== undefined) body.timeout_s = opts.timeoutS;
    return this.json("POST", `${CellhostClient.sessionPath(name)}/cells`, body);
  }

  /** The session's queued and running submitted cells (`listCells`). */
  async listCells(name: string): Promise<PendingCells> {
    return this.json("GET", `${CellhostClient.sessionPath(name)}/cells`);
  }

  /** A submitted cell's status, output so far and result once done (`getCell`). */
  async getCell(cell: string): Promise<CellSnapshot> {
    return this.json("GET", `/v1/cells/${seg(cell)}`);
  }

  /** Interrupts a running submitted cell or dequeues a queued one (`cancelCell`). */
  async cancelCell(cell: string): Promise<CellCancelled> {
    return this.json("DELETE", `/v1/cells/${seg(cell)}`);
  }

  /**
   * A submitted cell's events from `offset` (default 0), live until it
   * ends: `stream`/`display` events, then one of `result`, `error`,
   * `cancelled` (yielded, not thrown: the cell's end is data here).
   */
  async *cellEvents(cell: string, opts: { offset?: number; signal?: AbortSignal } = {}): AsyncGenerator<CellEvent> {
    const q = opts.offset === undefined ? "" : `?offset=${encodeURIComponent(String(opts.offset))}`;
    const resp = await this.send("GET", `/v1/cells/${seg(cell)}/events${q}`, {
      headers: { Accept: "text/event-stream" },
      signal: opts.signal,
    });
    if (resp.body === null) throw new CellhostError("bad_response", "cell events: no event stream", resp.status);
    for await (const ev of readEvents(resp.body)) {
      const id = Number(ev.id);
      yield { event: ev.event, id: Number.isFinite(id) ? id : -1, data: parseData(ev.data) } as CellEvent;
    }
  }

  // --- files and displays -------------------------------------------------

  /** Writes a file into the session's workdir, atomically (`writeFile`). */
  async putFile(name: string, path: string, body: FileBody): Promise<FileWritten> {
    const resp = await this.send("PUT", `${CellhostClient.sessionPath(name)}/files/${filePath(path)}`, {
      body: body as BodyInit,
      headers: { "Content-Type": "application/octet-stream" },
    });
    return (await resp.json()) as FileWritten;
  }

  /**
   * A file of the session's workdir (`readFile`); `range` is a byte range
   * `[start, end]` (inclusive, as HTTP's `Range: bytes=start-end`).
   */
  async getFile(name: string, path: string, range?: [number, number?]): Promise<Download> {
    const headers: Record<string, string> = {};
    if (range) headers.Range = `bytes=${range[0]}-${range[1] ?? ""}`;
    return this.download(`${CellhostClient.sessionPath(name)}/files/${filePath(path)}`, headers);
  }

  /** The entries of a directory of the workdir (`listFiles`; default: the workdir). */
  async listFiles(name: string, dir?: string): Promise<FileListing> {
    const q = dir === undefined ? "" : `?path=${encodeURIComponent(dir)}`;
    return this.json("GET", `${CellhostClient.sessionPath(name)}/files${q}`);
  }

  /** Removes a file, link or empty directory of the workdir (`deleteFile`). */
  async deleteFile(name: string, path: string): Promise<FileDeleted> {
    return this.json("DELETE", `${CellhostClient.sessionPath(name)}/files/${filePath(path)}`);
  }

  /** The bytes of a display (a figure) by its id (`readDisplay`). */
  async display(name: string, id: string): Promise<Download> {
    return this.download(`${CellhostClient.sessionPath(name)}/displays/${seg(id)}`);
  }

  /**
   * The bytes behind a URL the server gave (a display's `url`, a file's
   * `url`): a path on this server, fetched with the token.
   */
  async fetchUrl(url: string): Promise<Download> {
    if (!url.startsWith("/")) throw new CellhostError("bad_request", `not a path on this server: ${url}`);
    return this.download(url);
  }

  private async download(path: string, headers: Record<string, string> = {}): Promise<Download> {
    const resp = await this.send("GET", path, { headers });
    return {
      bytes: new Uint8Array(await resp.arrayBuffer()),
      contentType: resp.headers.get("content-type") ?? "application/octet-stream",
      status: resp.status,
    };
  }

  // --- notebooks ----------------------------------------------------------

  /**
   * Runs a notebook (`notebook`, an nbformat 4 object) or a percent-format
   * `script` (`runNotebook`), with papermill-style `parameters`, in a
   * session of its own or in `session`.
   */
  async runNotebook(body: RunNotebookBody): Promise<RunNotebookAnswer> {
    return this.json("POST", "/v1/notebooks/run", body);
  }
}

function parseData(text: string): never {
  try {
    return JSON.parse(text) as never;
  } catch {
    throw new CellhostError("bad_response", `an event whose data is not JSON: ${text.slice(0, 200)}`);
  }
}
