"""The official Python MCP SDK against cellhost's workspace tools over stdio:
files in and out (write_file, read_file, list_files, a refused path), the
image budget (a small figure inline, a large one as a resource link), cells
that outlive a call (submit_code, get_cell, cancel_cell), progress
keepalives of a long execute_code, and packages at runtime
(install_packages: a refused option; with the package index reachable, a
wheel from PyPI imported by the next cell while user code stays offline —
skipped with a printed reason when the index is unreachable).

Usage: python mcp_workspace.py SERVER_BINARY [SERVER_ARG ...]
Prints "ok NAME" / "FAIL NAME: why" per check; exits 1 if any failed.
"""

import base64
import sys

import anyio
from mcp import Client, StdioServerParameters

FAILURES = []


def check(name, cond, detail=""):
    if cond:
        print(f"ok {name}", flush=True)
    else:
        FAILURES.append(name)
        print(f"FAIL {name}: {detail}", flush=True)


OFFLINE = (
    "import urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen('https://pypi.org/simple/tomli/', timeout=10)\n"
    "    print('ONLINE')\n"
    "except Exception as e:\n"
    "    print('offline:', type(e).__name__)"
)


def index_unreachable():
    """Why the package index cannot be reached from the test's own process, or None."""
    import urllib.request
    try:
        urllib.request.urlopen("https://pypi.org/simple/tomli/", timeout=20).close()
        return None
    except Exception as e:  # noqa: BLE001
        return f"https://pypi.org/simple/tomli/ unreachable: {e}"


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


async def run(command, args):
    server = StdioServerParameters(command=command, args=args)
    async with Client(server, read_timeout_seconds=120) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        want = {"write_file", "read_file", "list_files", "submit_code", "get_cell", "cancel_cell", "install_packages"}
        check("workspace tools listed", want <= tools, sorted(tools))

        async def cell(code):
            return await client.call_tool("execute_code", {"code": code})

        r = await cell("import os\nos.makedirs('data', exist_ok=True)\n'ready'")
        check("a first cell", text_of(r).startswith("status: ok"), text_of(r))

        # --- files in and out -----------------------------------------------------
        w = await client.call_tool("write_file", {"path": "data/t.csv", "text": "a,b\n1,2\n"})
        check("write_file", not w.is_error and (w.structured_content or {}).get("size") == 8, w.structured_content)
        r = await cell("print(open('data/t.csv').read(), end='')")
        check("the next cell reads the written file", "a,b\n1,2" in text_of(r), text_of(r))
        await cell("open('out.bin', 'wb').write(bytes(range(256)))")
        rd = await client.call_tool("read_file", {"path": "out.bin"})
        sc = rd.structured_content or {}
        check(
            "read_file returns a cell's binary file as base64",
            sc.get("encoding") == "base64" and base64.b64decode(sc.get("base64", "")) == bytes(range(256)),
            sc,
        )
        rd = await client.call_tool("read_file", {"path": "data/t.csv", "offset": 2, "length": 3})
        sc = rd.structured_content or {}
        check("read_file pages by byte range", sc.get("text") == "b\n1" and sc.get("next_offset") == 5, sc)
        bad = await client.call_tool("read_file", {"path": "../../../../etc/passwd"})
        err = (bad.structured_content or {}).get("error") or {}
        check("a path out of the workdir is refused", bad.is_error and err.get("code") == "path_refused", bad.structured_content)
        ls = await client.call_tool("list_files", {})
        entries = {e["name"]: e["type"] for e in (ls.structured_content or {}).get("entries", [])}
        check("list_files", entries.get("data") == "dir" and entries.get("out.bin") == "file", entries)

        # --- the image budget -------------------------------------------------------
        r = await cell(
            "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
            "plt.figure(figsize=(2, 2)); plt.plot([1, 2]); plt.show()"
        )
        kinds = [c.type for c in r.content]
        check("a small figure is inline image content", "image" in kinds, kinds)
        r = await cell(
            "import numpy as np\nplt.figure(figsize=(10, 10), dpi=100)\n"
            "plt.imshow(np.random.default_rng(0).random((1000, 1000, 3))); plt.show()"
        )
        kinds = [c.type for c in r.content]
        t = text_of(r)
        inline = [c for c in r.content if c.type == "image"]
        check(
            "a large figure is downscaled within the budget, and the text says so",
            len(inline) == 1 and len(base64.b64decode(inline[0].data)) <= 256 * 1024
            and "image budget" in t and "downscaled from" in t,
            (kinds, t),
        )

        # --- cells that outlive a call ---------------------------------------------
        s1 = await client.call_tool(
            "submit_code",
            {"code": "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.3)\n'finished'"},
        )
        c1 = (s1.structured_content or {}).get("cell")
        s2 = await client.call_tool("submit_code", {"code": "never_ran = True"})
        c2 = (s2.structured_content or {}).get("cell")
        check("submit_code answers a cell id at once", bool(c1) and bool(c2), (s1.structured_content, s2.structured_content))
        g2 = await client.call_tool("get_cell", {"cell": c2})
        check("the second submitted cell waits", (g2.structured_content or {}).get("status") == "queued", g2.structured_content)
        k2 = await client.call_tool("cancel_cell", {"cell": c2})
        check("cancel_cell drops a queued cell", (k2.structured_content or {}).get("action") == "dequeued", k2.structured_content)
        g1 = await client.call_tool("get_cell", {"cell": c1, "wait_s": 60})
        t = text_of(g1)
        check("get_cell waits for the result", "done" in t and "step 2" in t and "finished" in t, t)
        r = await cell("'never_ran' in globals()")
        check("the dropped cell never ran", "False" in text_of(r), text_of(r))
        nf = await client.call_tool("get_cell", {"cell": "b-no-such"})
        err = (nf.structured_content or {}).get("error") or {}
        check("an unknown cell", nf.is_error and err.get("code") == "cell_not_found", nf.structured_content)

        # --- packages at runtime --------------------------------------------------
        bad = await client.call_tool("install_packages", {"packages": ["--index-url=https://evil.example/simple"]})
        err = (bad.structured_content or {}).get("error") or {}
        check("install_packages refuses an option", bad.is_error and err.get("code") == "invalid_package_spec", bad.structured_content)
        why = index_unreachable()
        if why:
            print(f"skipped install_packages from the index: {why}", flush=True)
        else:
            r = await client.call_tool("install_packages", {"packages": ["tomli"]})
            sc = r.structured_content or {}
            check(
                "install_packages installs a wheel from the index",
                not r.is_error and any(d.get("name") == "tomli" for d in sc.get("installed", [])),
                text_of(r),
            )
            r = await cell("import tomli\ntomli.loads('a = 1')['a']")
            check("the next cell imports it", text_of(r).startswith("status: ok") and "1" in text_of(r), text_of(r))
            r = await cell(OFFLINE)
            check("user code stays offline", "offline:" in text_of(r), text_of(r))

        # --- progress keepalives while a silent cell runs ---------------------------
        messages = []

        async def on_progress(progress, total, message):
            messages.append(message or "")

        r = await client.call_tool(
            "execute_code", {"code": "import time\ntime.sleep(12)"}, progress_callback=on_progress
        )
        check("a silent long cell sends keepalives", any("running for" in m for m in messages), messages)


def main():
    anyio.run(run, sys.argv[1], sys.argv[2:])
    if FAILURES:
        print(f"{len(FAILURES)} checks failed: {FAILURES}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
