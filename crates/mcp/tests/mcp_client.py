"""A real MCP client (the official Python SDK, `mcp` on PyPI) against cellhost's
stdio MCP server: an analysis session on the penguins data.

Usage: python mcp_client.py SERVER_BINARY [SERVER_ARG ...]   (stdio)
       python mcp_client.py http://127.0.0.1:PORT/mcp          (streamable HTTP)

Prints one line per check ("ok NAME" or "FAIL NAME: why") and exits 1 if any
check failed. Run by crates/mcp/tests/python_client.rs.
"""

import base64
import os
import sys
import time

import anyio
from mcp import Client, StdioServerParameters

FAILURES = []


def check(name, cond, detail=""):
    if cond:
        print(f"ok {name}", flush=True)
    else:
        FAILURES.append(name)
        print(f"FAIL {name}: {detail}", flush=True)


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def has_null(schema):
    if isinstance(schema, dict):
        t = schema.get("type")
        if t == "null" or (isinstance(t, list) and "null" in t) or "nullable" in schema:
            return True
        return any(has_null(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_null(v) for v in schema)
    return False


def fit_tools(tools):
    """Every tool: an outputSchema, annotations, no null unions."""
    by = {t.name: t for t in tools}
    check("every tool has an outputSchema", all(t.output_schema for t in tools),
          [t.name for t in tools if not t.output_schema])
    check("every tool has annotations", all(t.annotations for t in tools),
          [t.name for t in tools if not t.annotations])
    check("no null unions in schemas",
          not any(has_null(t.input_schema) or has_null(t.output_schema) for t in tools),
          [t.name for t in tools if has_null(t.input_schema) or has_null(t.output_schema)])
    ro = {n: by[n].annotations.read_only_hint for n in ("list_variables", "list_sessions", "read_output")}
    check("read-only hints", all(ro.values()), ro)
    check("restart is destructive", by["restart"].annotations.destructive_hint is True, by["restart"].annotations)
    check("execute_code is not read-only", by["execute_code"].annotations.read_only_hint is False,
          by["execute_code"].annotations)


async def persist(url):
    """--persist URL: two MCP connections one after the other (the way
    LangChain's adapter and CLI clients call tools) share the caller's sessions."""
    async with Client(url, read_timeout_seconds=120) as client:
        r = await client.call_tool("execute_code", {"code": "kept = 'across connections'"})
        check("persist: first connection ran", text_of(r).startswith("status: ok"), text_of(r))
    async with Client(url, read_timeout_seconds=120) as client:
        r = await client.call_tool("execute_code", {"code": "kept"})
        check("persist: a second connection sees the state", "'across connections'" in text_of(r), text_of(r))
        s = await client.call_tool("list_sessions", {})
        check("persist: the session is listed", "default" in text_of(s), text_of(s))


async def run(command, args):
    if command.startswith("http://") or command.startswith("https://"):
        server = command
    else:
        server = StdioServerParameters(command=command, args=args)
    async with Client(server, read_timeout_seconds=120) as client:
        tools = await client.list_tools()
        names = {t.name for t in tools.tools}
        want = {"execute_code", "interrupt", "restart", "list_variables", "read_output", "list_sessions", "run_notebook"}
        check("tools listed", want <= names, f"got {sorted(names)}")
        fit_tools(tools.tools)
        ex = next(t for t in tools.tools if t.name == "execute_code")
        check(
            "execute_code description states limits",
            "50,000" in ex.description and "300" in ex.description and "read_output" in ex.description,
            ex.description,
        )

        async def run_cell(code, **kw):
            args = {"code": code}
            args.update(kw)
            return await client.call_tool("execute_code", args)

        # --- state kept across calls --------------------------------------------
        r = await run_cell(
            "import pandas as pd\nfrom palmerpenguins import load_penguins\n"
            "df = load_penguins()\ndf.shape"
        )
        t = text_of(r)
        check("load penguins", t.startswith("status: ok") and "(344, 8)" in t, t)
        check("structured content", (r.structured_content or {}).get("status") == "ok", r.structured_content)
        check("not an error", not r.is_error, r.is_error)

        r = await run_cell("means = df.groupby('species')['body_mass_g'].mean().round(1)\nprint(means)")
        t = text_of(r)
        check("state kept across calls", "Adelie" in t and "Gentoo" in t and "--- stdout ---" in t, t)

        # --- a figure as image content ------------------------------------------
        r = await run_cell(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots()\n"
            "for s, g in df.groupby('species'):\n"
            "    ax.scatter(g.bill_length_mm, g.flipper_length_mm, label=s)\n"
            "ax.legend()\nplt.show()"
        )
        images = [c for c in r.content if c.type == "image"]
        check("figure returned as image", len(images) == 1, [c.type for c in r.content])
        if images:
            png = base64.b64decode(images[0].data)
            check("image is a PNG", images[0].mime_type == "image/png" and png[:8] == b"\x89PNG\r\n\x1a\n",
                  images[0].mime_type)
        displays = (r.structured_content or {}).get("displays") or []
        check("figure in structured displays", len(displays) == 1, displays)

        # --- live output as progress notifications ------------------------------
        messages = []

        async def on_progress(progress, total, message):
            messages.append(message or "")

        r = await client.call_tool(
            "execute_code",
            {"code": "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.4)"},
            progress_callback=on_progress,
        )
        check("progress notifications carry live output", any("tick" in m for m in messages), messages)
        check("progress cell ok", text_of(r).startswith("status: ok"), text_of(r))

        # --- an error -------------------------------------------------------------
        r = await run_cell("df['no_such_column']")
        t = text_of(r)
        # An exception in the cell is a successful tool call saying status: error
        # (the SDK validated its structured content against the outputSchema).
        check("error reported", not r.is_error and t.startswith("status: error") and "KeyError" in t, t)
        err = (r.structured_content or {}).get("error") or {}
        check("error structured", r.structured_content.get("status") == "error" and err.get("ename") == "KeyError",
              r.structured_content)

        # --- cancellation interrupts a sleeping cell; variables survive ---------
        await run_cell("survivor = 42")
        started = time.monotonic()
        with anyio.move_on_after(3) as scope:
            await run_cell("import time\ntime.sleep(120)")
        check("call was cancelled", scope.cancelled_caught, "the sleeping cell returned")
        r = await run_cell("survivor + 1")
        elapsed = time.monotonic() - started
        t = text_of(r)
        check("cancellation interrupted the cell", elapsed < 30, f"{elapsed:.1f} s")
        check("variable survives the cancellation", t.startswith("status: ok") and "43" in t, t)

        # --- the interrupt tool stops a running cell of the session ---------------
        box = {}

        async def sleeper():
            box["r"] = await run_cell("import time\ntime.sleep(120)")

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.sleep(1.5)
            ir = await client.call_tool("interrupt", {"session": "default"})
        elapsed = time.monotonic() - started
        check("interrupt tool delivered", "interrupt delivered" in text_of(ir), text_of(ir))
        t = text_of(box["r"])
        check("interrupted cell says so", t.startswith("status: interrupted") and elapsed < 30, f"{elapsed:.1f} s: {t}")

        # --- a timeout ------------------------------------------------------------
        started = time.monotonic()
        r = await run_cell("import time\ntime.sleep(60)", timeout_s=2)
        elapsed = time.monotonic() - started
        t = text_of(r)
        sc = r.structured_content or {}
        check("timeout status", t.startswith("status: timeout") and sc.get("status") == "timeout", t)
        check("timeout in time", elapsed < 20, f"{elapsed:.1f} s")
        check("timeout kept state", (sc.get("interrupt") or {}).get("state_kept") is True, sc.get("interrupt"))
        check("timeout fault", sc.get("fault") == "timeout" and "[fault: timeout:" in t, t)
        r = await run_cell("survivor")
        check("variable survives the timeout", "42" in text_of(r), text_of(r))

        # --- truncated output and read_output ------------------------------------
        r = await run_cell("print('x' * 200_000)\nprint('END')")
        t = text_of(r)
        sc = r.structured_content or {}
        check("stdout truncated", "stdout truncated" in t and "read_output" in t, t[-600:])
        cell = sc.get("cell_id")
        total = ((sc.get("truncated") or {}).get("stdout") or {}).get("total_bytes")
        page = await client.call_tool(
            "read_output", {"cell": cell, "stream": "stdout", "offset": 199_990, "length": 100}
        )
        pt = text_of(page)
        check("read_output pages the spill", "END" in pt and not page.is_error, pt)
        check("spill has every byte", total == 200_005, total)
        bad = await client.call_tool("read_output", {"cell": "c-nope", "stream": "stdout"})
        check("read_output refuses unknown cells", bad.is_error, text_of(bad))

        # --- variables, sessions, interrupt, restart ------------------------------
        r = await client.call_tool("list_variables", {})
        t = text_of(r)
        check("list_variables", "df: pandas.DataFrame, shape [344,8]" in t and "survivor: int" in t, t)
        await run_cell("y = 1", session="other")
        r = await client.call_tool("list_sessions", {})
        sessions = {s["session"] for s in (r.structured_content or {}).get("sessions", [])}
        check("list_sessions", sessions == {"default", "other"}, sessions)
        # --- run_notebook: parameters, a failed cell, a language without a runtime
        r = await client.call_tool(
            "run_notebook",
            {"script": "# %% tags=[\"parameters\"]\nn = 1\n# %%\nprint(n * 2)", "parameters": {"n": 21}},
        )
        sc = r.structured_content or {}
        cells = (sc.get("notebook") or {}).get("cells", [])
        check(
            "run_notebook injects parameters and runs every cell",
            not r.is_error and sc.get("ran") == 3 and "42" in text_of(r)
            and cells[1]["metadata"]["tags"] == ["injected-parameters"],
            text_of(r),
        )
        r = await client.call_tool("run_notebook", {"script": "print(y)", "session": "other"})
        check("run_notebook in a named session sees its state", "1" in text_of(r) and not r.is_error, text_of(r))
        r = await client.call_tool("run_notebook", {"script": "# %%\n1/0\n# %%\nprint('no')"})
        sc = r.structured_content or {}
        check(
            "run_notebook stops at a failed cell",
            r.is_error and (sc.get("stop") or {}).get("reason") == "cell_failed" and "ZeroDivisionError" in text_of(r),
            text_of(r),
        )
        r_nb = {"cells": [], "metadata": {"kernelspec": {"name": "julia-1.10", "language": "julia", "display_name": "Julia"}},
                "nbformat": 4, "nbformat_minor": 5}
        r = await client.call_tool("run_notebook", {"notebook": r_nb})
        check(
            "run_notebook refuses a language without a runtime",
            r.is_error and ((r.structured_content or {}).get("error") or {}).get("code") == "unsupported_language",
            text_of(r),
        )
        r = await client.call_tool("list_sessions", {})
        sessions = {s["session"] for s in (r.structured_content or {}).get("sessions", [])}
        check("run_notebook leaves no session of its own", sessions == {"default", "other"}, sessions)
        # --- pause_session: checkpoint, kernel stopped, resumed by the next cell ---
        r = await run_cell("import numpy as np\nbig = np.ones(5_000_000)\nmarker = 'paused'\ngen = (i for i in [1])", session="pz")
        p = await client.call_tool("pause_session", {"session": "pz"})
        sc = p.structured_content or {}
        ck = sc.get("checkpoint") or {}
        check("pause_session checkpoints and stops the kernel",
              not p.is_error and sc.get("memory_freed_bytes", 0) > (20 << 20) and "big" in ck.get("saved", [])
              and not os.path.exists(f"/proc/{sc.get('pid', 0)}"), (sc, text_of(p)))
        check("pause_session names what it could not save",
              any(l.get("name") == "gen" for l in ck.get("lost", [])) and "gen" in text_of(p), text_of(p))
        again = await client.call_tool("pause_session", {"session": "pz"})
        check("pause_session of a paused session is session_not_found",
              again.is_error and ((again.structured_content or {}).get("error") or {}).get("code") == "session_not_found",
              again.structured_content)
        r = await run_cell("(float(big.sum()), marker)", session="pz")
        restored = (r.structured_content or {}).get("restored") or {}
        check("the next cell resumes the paused session",
              "5000000.0" in text_of(r) and restored.get("resumed") is True, (text_of(r), restored))
        await client.call_tool("restart", {"session": "pz"})
        r = await client.call_tool("interrupt", {"session": "default"})
        check("interrupt an idle session", "not delivered" in text_of(r) or "delivered" in text_of(r), text_of(r))
        r = await client.call_tool("restart", {"session": "default"})
        check("restart", "restarted" in text_of(r) and not r.is_error, text_of(r))
        r = await run_cell("'survivor' in globals()")
        t = text_of(r)
        check("restart dropped the state", "False" in t and "STATE RESET" in t, t)
        r = await run_cell("z = 5", session="other", reset=True)
        r = await run_cell("'y' in globals()", session="other")
        check("reset dropped the state", "False" in text_of(r), text_of(r))

        # --- a forbidden system call: the kernel ends, the fault says why ----
        r = await run_cell("import ctypes\nctypes.CDLL(None).syscall(246, 0, 0, 0, 0)", session="other")
        t = text_of(r)
        sc = r.structured_content or {}
        check("seccomp fault", sc.get("status") == "crashed" and sc.get("fault") == "seccomp"
              and "[fault: seccomp:" in t, t)
        r = await run_cell("6 * 7", session="other")
        check("a new kernel after the seccomp fault", "42" in text_of(r), text_of(r))
        await r_session(client)


async def r_session(client):
    """execute_code with `language: "r"`: an R session keeps state and its
    language; naming another language for it is a clear error. Skipped (said
    so) where R or its jsonlite package is missing."""
    import shutil
    import subprocess
    r = shutil.which("R")
    if r is None or subprocess.run(
        [r, "--no-echo", "-e", "quit(status = !requireNamespace('jsonlite', quietly = TRUE))"],
        capture_output=True,
    ).returncode != 0:
        print("skipped R checks: no R with jsonlite on PATH", flush=True)
        return
    res = await client.call_tool("execute_code", {"code": "x <- 21\nx * 2", "session": "rs", "language": "r"})
    check("R: execute_code with language r", text_of(res).startswith("status: ok") and "[1] 42" in text_of(res),
          text_of(res))
    res = await client.call_tool("execute_code", {"code": "x + 1", "session": "rs"})
    check("R: the session keeps its language and state", "[1] 22" in text_of(res), text_of(res))
    res = await client.call_tool("execute_code", {"code": "x", "session": "rs", "language": "python"})
    check("R: another language for the session is an error",
          res.is_error and "keeps the language it was created with" in text_of(res), text_of(res))
    res = await client.call_tool("execute_code", {"code": "stop('nope')", "session": "rs"})
    check("R: an R error", res.is_error or "simpleError" in text_of(res), text_of(res))
    res = await client.call_tool("list_variables", {"session": "rs"})
    check("R: list_variables", "x" in text_of(res) and "numeric" in text_of(res), text_of(res))
    res = await client.call_tool("execute_code", {"code": "plot(1:10)", "session": "rs"})
    check("R: a plot as image content", any(c.type == "image" for c in res.content), [c.type for c in res.content])



async def isolation(url):
    """Two MCP sessions over HTTP are two owners: same session name, separate namespaces."""
    async with Client(url, read_timeout_seconds=120) as a, Client(url, read_timeout_seconds=120) as b:
        await a.call_tool("execute_code", {"code": "who = 'a'"})
        await b.call_tool("execute_code", {"code": "who = 'b'"})
        ra = await a.call_tool("execute_code", {"code": "who"})
        rb = await b.call_tool("execute_code", {"code": "who"})
        check("owners isolated (a)", "'a'" in text_of(ra), text_of(ra))
        check("owners isolated (b)", "'b'" in text_of(rb), text_of(rb))
        r = await a.call_tool("execute_code", {"code": "print('y' * 100_000)"})
        cell = (r.structured_content or {}).get("cell_id")
        other = await b.call_tool("read_output", {"cell": cell, "stream": "stdout"})
        check("another owner's output is refused", other.is_error, text_of(other))


def caller_binding(url):
    """An MCP session is bound to its first authenticated caller (the test server
    takes the caller from an `x-test-caller` header): a request of another
    caller with the same Mcp-Session-Id is refused."""
    import json

    import httpx2

    def post(body, caller, sid=None):
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-06-18",
            "x-test-caller": caller,
        }
        if sid:
            headers["mcp-session-id"] = sid
        r = httpx2.post(url, headers=headers, content=json.dumps(body), timeout=60)
        msgs = []
        for line in r.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                msgs.append(json.loads(line[5:]))
        if not msgs and r.text.strip().startswith("{"):
            msgs.append(json.loads(r.text))
        return r, msgs

    r, msgs = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}, "alice")
    sid = r.headers.get("mcp-session-id")
    check("raw initialize", r.status_code == 200 and sid, (r.status_code, r.text[:300]))
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, "alice", sid)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_sessions", "arguments": {}}}
    r, msgs = post(call, "alice", sid)
    check("first caller served", any("result" in m for m in msgs), (r.status_code, r.text[:300]))
    call["id"] = 3
    r, msgs = post(call, "mallory", sid)
    # Answered like an unknown session: the id is not even confirmed to exist.
    refused = r.status_code == 404
    check("another caller refused", refused and not any("result" in m for m in msgs), (r.status_code, r.text[:300]))


async def matrix(command, args):
    """The MCP row of the surface x request matrix, against a server whose
    default cell deadline is 2 s: default and explicit deadline, the sandbox
    mode, the busy rule (error code session_busy unless queue: true)."""
    server = StdioServerParameters(command=command, args=args)
    async with Client(server, read_timeout_seconds=120) as client:
        async def run_cell(code, **kw):
            a = {"code": code}
            a.update(kw)
            return await client.call_tool("execute_code", a)

        r = await run_cell("import time\ntime.sleep(30)")
        sc = r.structured_content or {}
        check("matrix: default deadline applies", sc.get("status") == "timeout", text_of(r))
        r = await run_cell("import time\ntime.sleep(3)\n'done'", timeout_s=60)
        sc = r.structured_content or {}
        check("matrix: explicit deadline overrides", sc.get("status") == "ok" and "'done'" in text_of(r), text_of(r))
        mode = ((sc.get("kernel") or {}).get("sandbox") or {}).get("mode")
        check("matrix: sandbox mode reported", mode == "auto", mode)

        await run_cell("who = 'me'")
        box = {}

        async def sleeper():
            box["r"] = await run_cell("import time\ntime.sleep(120)", timeout_s=0)

        async def queued():
            box["q"] = await run_cell("who", queue=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                s = await client.call_tool("list_sessions", {})
                rows = (s.structured_content or {}).get("sessions", [])
                if any(x.get("busy") for x in rows):
                    break
                await anyio.sleep(0.05)
            busy = await run_cell("1")
            err = (busy.structured_content or {}).get("error") or {}
            check("matrix: busy is refused", busy.is_error and err.get("code") == "session_busy"
                  and "session_busy" in text_of(busy), (busy.structured_content, text_of(busy)))
            other = await run_cell("2", session="other")
            check("matrix: another session is not busy", not other.is_error, text_of(other))
            tg.start_soon(queued)
            await anyio.sleep(0.3)
            check("matrix: a queued call waits", "q" not in box, box.get("q"))
            await client.call_tool("interrupt", {"session": "default"})
        t = text_of(box["r"])
        check("matrix: the running cell was interrupted", t.startswith("status: interrupted"), t)
        t = text_of(box["q"])
        check("matrix: the queued call ran after it", t.startswith("status: ok") and "'me'" in t, t)
        bad = await client.call_tool("read_output", {"cell": "c-nope", "stream": "stdout"})
        err = (bad.structured_content or {}).get("error") or {}
        check("matrix: tool errors carry codes", bad.is_error and err.get("code") == "output_not_found", bad.structured_content)


def main():
    if sys.argv[1] == "--persist":
        anyio.run(persist, sys.argv[2])
        if FAILURES:
            print(f"{len(FAILURES)} checks failed: {FAILURES}", flush=True)
            sys.exit(1)
        print("all checks passed", flush=True)
        return
    if sys.argv[1] == "--matrix":
        anyio.run(matrix, sys.argv[2], sys.argv[3:])
        if FAILURES:
            print(f"{len(FAILURES)} checks failed: {FAILURES}", flush=True)
            sys.exit(1)
        print("all checks passed", flush=True)
        return
    command, args = sys.argv[1], sys.argv[2:]
    anyio.run(run, command, args)
    if command.startswith("http"):
        anyio.run(isolation, command)
        caller_binding(command)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed: {FAILURES}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
