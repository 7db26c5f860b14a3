"""The official Python MCP SDK against execute_code's and submit_code's
`limits` and `network` over stdio: a session created with `disk_mb` gets a
`disk` fault for a write past it, a list `network` gives its kernel the
egress proxy, a running session keeps its limits (a note says so), a value
over the operator's maximum is the tool error `limit_over_max` naming the
field and the maximum, an out-of-range value and a malformed rule are
`bad_request`, an unknown limit is refused by the parameters' schema, and
submit_code takes the same.

Usage: python mcp_limits.py SERVER_BINARY [SERVER_ARG ...] (the server run
with --max-disk-mb 64).
Prints "ok NAME" / "FAIL NAME: why" per check; exits 1 if any failed.
"""

import sys

import anyio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

FAILURES = []


def check(name, cond, detail=""):
    if cond:
        print(f"ok {name}", flush=True)
    else:
        FAILURES.append(name)
        print(f"FAIL {name}: {detail}", flush=True)


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


PROBE = (
    "import os\n"
    "print(os.environ.get('HTTPS_PROXY'))\n"
    "with open('big.bin', 'wb') as f:\n"
    "    f.write(b'\\0' * (12 << 20))\n"
)


async def run(command, args):
    server = StdioServerParameters(command=command, args=args)
    async with Client(server, read_timeout_seconds=120) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("execute_code", "submit_code"):
            props = (tools[name].input_schema or {}).get("properties", {})
            check(f"{name} takes limits and network", "limits" in props and "network" in props, props.keys())

        r = await client.call_tool(
            "execute_code",
            {"code": PROBE, "session": "lim", "limits": {"disk_mb": 8}, "network": ["127.0.0.1:9"]},
        )
        sc = r.structured_content or {}
        check("a write past disk_mb is the fault disk", sc.get("fault") == "disk", text_of(r))
        check(
            "a list network gives the kernel the proxy",
            (sc.get("stdout") or "").startswith("http://127.0.0.1:"),
            sc.get("stdout"),
        )

        r = await client.call_tool("execute_code", {"code": "1", "session": "lim", "limits": {"disk_mb": 16}})
        check("a running session keeps its limits, and says so", "other limits" in text_of(r), text_of(r))

        r = await client.call_tool("execute_code", {"code": "1", "session": "big", "limits": {"disk_mb": 100000}})
        err = (r.structured_content or {}).get("error") or {}
        check(
            "over the maximum is limit_over_max naming field and maximum",
            r.is_error and err.get("code") == "limit_over_max" and err.get("field") == "disk_mb" and err.get("max") == 64,
            r.structured_content,
        )
        r = await client.call_tool("execute_code", {"code": "1", "session": "small", "limits": {"memory_mb": 1}})
        err = (r.structured_content or {}).get("error") or {}
        check("out of range is bad_request", r.is_error and err.get("code") == "bad_request", r.structured_content)
        r = await client.call_tool("execute_code", {"code": "1", "session": "net", "network": ["bad host:x"]})
        err = (r.structured_content or {}).get("error") or {}
        check("a malformed rule is bad_request", r.is_error and err.get("code") == "bad_request", r.structured_content)
        try:
            r = await client.call_tool("execute_code", {"code": "1", "session": "typo", "limits": {"memroy_mb": 64}})
            refused = r.is_error
        except MCPError:
            refused = True
        check("an unknown limit is refused", refused, "accepted")
        r = await client.call_tool("list_sessions", {})
        names = [s.get("name") for s in (r.structured_content or {}).get("sessions", [])]
        check("refused calls created no session", not {"big", "small", "net", "typo"} & set(names), names)

        s = await client.call_tool(
            "submit_code", {"code": PROBE, "session": "bg", "limits": {"disk_mb": 8}, "network": ["127.0.0.1:9"]}
        )
        cell = (s.structured_content or {}).get("cell")
        g = await client.call_tool("get_cell", {"cell": cell, "wait_s": 60})
        # A finished cell's structured content is its CellResult.
        result = g.structured_content or {}
        check("submit_code's limits: the fault disk", result.get("fault") == "disk", g.structured_content)
        check(
            "submit_code's network: the proxy",
            (result.get("stdout") or "").startswith("http://127.0.0.1:"),
            result.get("stdout"),
        )
        s = await client.call_tool("submit_code", {"code": "1", "session": "bg2", "limits": {"disk_mb": 100000}})
        err = (s.structured_content or {}).get("error") or {}
        check("submit_code over the maximum is refused at once", s.is_error and err.get("code") == "limit_over_max", s.structured_content)


def main():
    anyio.run(run, sys.argv[1], sys.argv[2:])
    if FAILURES:
        print(f"{len(FAILURES)} checks failed: {FAILURES}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
