// A real `cellhost serve` for the tests: loopback port the OS picks, a
// fresh random token in a private token file, a state directory of its own;
// stopped (SIGTERM, then waited for) and removed by `stop()`.
//
// The binary is CELLHOST_BIN, else the workspace's target/debug/cellhost;
// the kernels' interpreter is CELLHOST_TEST_PYTHON (numpy, matplotlib).

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const HERE = dirname(fileURLToPath(import.meta.url));
const READY = "cellhost: serving http://";

export function binary() {
  const bin = process.env.CELLHOST_BIN || resolve(HERE, "../../../target/debug/cellhost");
  if (!existsSync(bin)) throw new Error(`no cellhost binary at ${bin} (cargo build -p cellhost, or set CELLHOST_BIN)`);
  return bin;
}

/** Starts the server; resolves once it prints its address. */
export async function startServer() {
  const dir = mkdtempSync(join(process.env.TMPDIR || tmpdir(), "cellhost-ts-"));
  const token = randomBytes(32).toString("hex");
  const tokens = join(dir, "tokens");
  writeFileSync(tokens, `ts ${token} rw\n`, { mode: 0o600 });
  const args = ["serve", "--listen", "127.0.0.1:0", "--token-file", tokens];
  if (process.env.CELLHOST_TEST_PYTHON) args.push("--python", process.env.CELLHOST_TEST_PYTHON);
  const child = spawn(binary(), args, {
    cwd: dir,
    env: { ...process.env, CELLHOST_STATE_DIR: join(dir, "state") },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const exited = new Promise((res) => child.once("exit", (code, signal) => res({ code, signal })));
  const log = [];
  const lines = createInterface({ input: child.stderr });
  const baseUrl = await new Promise((res, rej) => {
    lines.on("line", (line) => {
      log.push(line);
      if (log.length > 200) log.shift();
      if (line.startsWith(READY)) res(`http://${line.slice(READY.length).split("/")[0]}`);
    });
    exited.then(({ code, signal }) =>
      rej(new Error(`cellhost serve exited (${code ?? signal}): ${log.slice(-10).join(" | ")}`)),
    );
  }).catch((e) => {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  });
  return {
    baseUrl,
    token,
    log,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
