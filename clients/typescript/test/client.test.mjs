// The client against a real `cellhost serve` (test/server.mjs), through
// the built package (dist/, `npm run build` first; `npm test` does both).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

import { CellhostClient, CellhostError } from "../dist/index.js";
import { startServer } from "./server.mjs";

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "..");

let server;
let client;

before(async () => {
  server = await startServer();
  client = new CellhostClient({ baseUrl: server.baseUrl, token: server.token });
});

after(async () => {
  if (server) await server.stop();
});

/** A session for one test, deleted when the test ends (even when it fails). */
async function withSession(t, name) {
  const info = await client.createSession({ name });
  t.after(() => client.deleteSession(name).catch(() => undefined));
  return info;
}

/** The CellhostError `fn` throws (fails the test when it throws something else or nothing). */
async function rejection(fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof CellhostError, `not a CellhostError: ${e}`);
    return e;
  }
  assert.fail("no error");
}

test("the generated types are those of the document the server serves", async () => {
  const served = await client.openapi();
  const committed = JSON.parse(readFileSync(join(PKG, "openapi.json"), "utf-8"));
  assert.deepEqual(served, committed, "openapi.json differs from the served document: run `npm run generate` (see README)");
  const dir = mkdtempSync(join(process.env.TMPDIR || tmpdir(), "cellhost-ts-gen-"));
  try {
    const doc = join(dir, "openapi.json");
    writeFileSync(doc, JSON.stringify(served));
    const out = join(dir, "schema.ts");
    const cli = join(PKG, "node_modules/openapi-typescript/bin/cli.js");
    const run = spawnSync(process.execPath, [cli, doc, "--output", out], { encoding: "utf-8" });
    assert.equal(run.status, 0, `openapi-typescript failed: ${run.stderr}`);
    assert.equal(
      readFileSync(out, "utf-8"),
      readFileSync(join(PKG, "src/schema.ts"), "utf-8"),
      "src/schema.ts is not what openapi-typescript generates from the served document: run `npm run generate`",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a cell: output, result, variables that persist, restart, sessions", async (t) => {
  const info = await withSession(t, "ts-cell");
  assert.equal(info.name, "ts-cell");
  assert.equal(info.alive, true);
  const r = await client.execute("ts-cell", "x = 6 * 7\nprint('hello')\nx");
  assert.equal(r.status, "ok");
  assert.equal(r.stdout, "hello\n");
  assert.equal(r.result?.["text/plain"], "42");
  assert.equal(r.kernel.session, "ts-cell");
  const again = await client.execute("ts-cell", "x + 1");
  assert.equal(again.result?.["text/plain"], "43");
  const vars = await client.variables("ts-cell");
  assert.ok(vars.variables.some((v) => v.name === "x" && v.type === "int"), JSON.stringify(vars));
  const names = (await client.listSessions()).map((s) => s.name);
  assert.ok(names.includes("ts-cell"), names.join(","));

  const failed = await client.execute("ts-cell", "1 / 0");
  assert.equal(failed.status, "error");
  assert.equal(failed.error?.ename, "ZeroDivisionError");

  const events = [];
  for await (const ev of client.executeStream("ts-cell", "print('a', flush=True)\n'b'")) events.push(ev);
  assert.deepEqual(events[0], { event: "stream", data: { name: "stdout", text: "a\n" } });
  assert.equal(events.at(-1).event, "result");
  assert.equal(events.at(-1).data.result["text/plain"], "'b'");

  const restarted = await client.restart("ts-cell");
  assert.equal(restarted.generation, 2);
  const gone = await client.execute("ts-cell", "x");
  assert.equal(gone.status, "error");
  assert.equal(gone.error?.ename, "NameError");
});

test("a figure: its URL serves the PNG; images inline and none", async (t) => {
  await withSession(t, "ts-figure");
  const code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()";
  const r = await client.execute("ts-figure", code);
  assert.equal(r.status, "ok", JSON.stringify(r.error));
  assert.equal(r.displays.length, 1);
  const png = r.displays[0].data["image/png"];
  assert.equal(typeof png.url, "string");
  const got = await client.fetchUrl(png.url);
  assert.equal(got.contentType, "image/png");
  assert.deepEqual([...got.bytes.slice(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.equal(got.bytes.length, png.bytes);
  const byId = await client.display("ts-figure", png.url.split("/").at(-1));
  assert.deepEqual(byId.bytes, got.bytes);

  const inline = await client.execute("ts-figure", code, { images: "inline" });
  const b64 = inline.displays[0].data["image/png"];
  assert.equal(typeof b64, "string");
  assert.equal(Buffer.from(b64, "base64").subarray(1, 4).toString("latin1"), "PNG");
  const none = await client.execute("ts-figure", code, { images: "none" });
  assert.equal(none.displays.every((d) => !("image/png" in d.data)), true, JSON.stringify(none.displays));

  const missing = await rejection(() => client.display("ts-figure", "c0-00000000.9"));
  assert.equal(missing.code, "display_not_found");
  assert.equal(missing.status, 404);
});

test("an interrupt stops a running cell", async (t) => {
  await withSession(t, "ts-interrupt");
  const code = "import time\nprint('started', flush=True)\ntime.sleep(600)";
  let answer;
  let result;
  for await (const ev of client.executeStream("ts-interrupt", code)) {
    if (ev.event === "stream" && ev.data.text.includes("started") && !answer) {
      answer = await client.interrupt("ts-interrupt");
    } else if (ev.event === "result") {
      result = ev.data;
    }
  }
  assert.equal(answer.delivered, true, JSON.stringify(answer));
  assert.equal(result.status, "interrupted");
  const after = await client.execute("ts-interrupt", "'alive'");
  assert.equal(after.result?.["text/plain"], "'alive'");
});

test("a submitted cell: handle at once, events from any offset, snapshot, cancel", async (t) => {
  await withSession(t, "ts-submit");
  const sub = await client.submit("ts-submit", "for i in range(3):\n    print(i, flush=True)\n'done'");
  assert.equal(sub.session, "ts-submit");
  assert.ok(sub.cell.length > 0);
  const events = [];
  for await (const ev of client.cellEvents(sub.cell)) events.push(ev);
  const last = events.at(-1);
  assert.equal(last.event, "result");
  assert.equal(last.data.status, "ok");
  assert.equal(last.data.result["text/plain"], "'done'");
  assert.deepEqual(
    events.map((e) => e.id),
    events.map((_, i) => i),
  );
  const out = events.filter((e) => e.event === "stream").map((e) => e.data.text).join("");
  assert.equal(out, "0\n1\n2\n");
  const tail = [];
  for await (const ev of client.cellEvents(sub.cell, { offset: last.id })) tail.push(ev);
  assert.deepEqual(tail, [last]);
  const snap = await client.getCell(sub.cell);
  assert.equal(snap.status, "done");
  assert.equal(snap.stdout, "0\n1\n2\n");
  assert.equal(snap.result?.status, "ok");

  const long = await client.submit("ts-submit", "import time\nprint('going', flush=True)\ntime.sleep(600)");
  let cancelled;
  let end;
  for await (const ev of client.cellEvents(long.cell)) {
    if (ev.event === "stream" && ev.data.text.includes("going") && !cancelled) {
      cancelled = await client.cancelCell(long.cell);
    } else if (ev.event !== "stream" && ev.event !== "display") {
      end = ev;
    }
  }
  assert.equal(cancelled.action, "interrupted", JSON.stringify(cancelled));
  assert.equal(end.event, "result", JSON.stringify(end));
  assert.equal(end.data.status, "interrupted");
  assert.equal((await client.listCells("ts-submit")).cells.length, 0);

  const unknown = await rejection(() => client.getCell("no-such-cell"));
  assert.equal(unknown.code, "cell_not_found");
});

test("a file round trip: put, a cell reads and writes, list, range, delete", async (t) => {
  await withSession(t, "ts-files");
  const bytes = new Uint8Array([0, 1, 2, 0xff, 0xfe, 10, 65, 66, 67]);
  const put = await client.putFile("ts-files", "in/data.bin", bytes);
  assert.equal(put.path, "in/data.bin");
  assert.equal(put.size, bytes.length);
  assert.equal(put.replaced, false);
  const over = await client.putFile("ts-files", "in/data.bin", bytes);
  assert.equal(over.replaced, true);

  const r = await client.execute(
    "ts-files",
    "data = open('in/data.bin', 'rb').read()\nopen('out.txt', 'w').write(data.hex())\nlen(data)",
  );
  assert.equal(r.result?.["text/plain"], String(bytes.length));
  const back = await client.getFile("ts-files", "out.txt");
  assert.equal(new TextDecoder().decode(back.bytes), Buffer.from(bytes).toString("hex"));

  const whole = await client.getFile("ts-files", "in/data.bin");
  assert.deepEqual(whole.bytes, bytes);
  const part = await client.getFile("ts-files", "in/data.bin", [3, 4]);
  assert.equal(part.status, 206);
  assert.deepEqual(part.bytes, bytes.slice(3, 5));

  const top = await client.listFiles("ts-files");
  const byName = Object.fromEntries(top.entries.map((e) => [e.name, e]));
  assert.equal(byName.in?.type, "dir");
  assert.equal(byName["out.txt"]?.type, "file");
  const sub = await client.listFiles("ts-files", "in");
  assert.deepEqual(
    sub.entries.map((e) => [e.name, e.size]),
    [["data.bin", bytes.length]],
  );

  const deleted = await client.deleteFile("ts-files", "in/data.bin");
  assert.deepEqual(deleted, { path: "in/data.bin", type: "file" });
  const missing = await rejection(() => client.getFile("ts-files", "in/data.bin"));
  assert.equal(missing.code, "file_not_found");
  assert.equal(missing.status, 404);
  const refused = await rejection(() => client.putFile("ts-files", "/etc/passwd", "x"));
  assert.equal(refused.code, "path_refused");
});

test("errors carry the server's code, status and fields", async (t) => {
  const nope = await rejection(() => client.execute("ts-no-such-session", "1"));
  assert.equal(nope.code, "session_not_found");
  assert.equal(nope.status, 404);
  assert.equal(nope.fields.session, "ts-no-such-session");
  assert.match(nope.message, /^session_not_found: /);

  await withSession(t, "ts-errors");
  const taken = await rejection(() => client.createSession({ name: "ts-errors" }));
  assert.equal(taken.code, "session_exists");
  assert.equal(taken.status, 409);

  const bad = await rejection(() => client.execute("ts-errors", "1", { timeoutS: -1 }));
  assert.equal(bad.status, 422);
  assert.equal(bad.code, "invalid_request");

  const stranger = new CellhostClient({ baseUrl: server.baseUrl, token: "0".repeat(64) });
  const denied = await rejection(() => stranger.listSessions());
  assert.equal(denied.code, "unauthorized");
  assert.equal(denied.status, 401);

  const unreachable = new CellhostClient({ baseUrl: "http://127.0.0.1:1", token: server.token });
  const down = await rejection(() => unreachable.listSessions());
  assert.equal(down.code, "host_unavailable");
  assert.equal(down.status, 0);
});

test("run a notebook with parameters", async () => {
  const notebook = {
    nbformat: 4,
    nbformat_minor: 5,
    metadata: { kernelspec: { name: "python3", language: "python", display_name: "Python 3" } },
    cells: [
      { cell_type: "code", metadata: { tags: ["parameters"] }, source: "n = 1", outputs: [], execution_count: null },
      { cell_type: "code", metadata: {}, source: "print(n * 10)", outputs: [], execution_count: null },
    ],
  };
  const ran = await client.runNotebook({ notebook, parameters: { n: 4 } });
  assert.equal(ran.stop ?? null, null, JSON.stringify(ran.stop));
  // The two cells and the `injected-parameters` cell after the `parameters` one.
  assert.equal(ran.total, 3);
  assert.equal(ran.ran, 3);
  const cells = ran.notebook.cells;
  assert.deepEqual(cells[1].metadata.tags, ["injected-parameters"]);
  const printed = cells.at(-1).outputs.map((o) => o.text).join("");
  assert.equal(printed.trim(), "40");
});
