"""The installed `cellhost` wheel against its own `cellhost serve`.

Run by scripts/test-wheel.sh in a fresh venv; the kernels' interpreter is
CELLHOST_TEST_PYTHON (numpy/matplotlib for the figure test), else this one.
"""

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request

import pytest

import cellhost
from cellhost import AsyncSession, Session
from cellhost.e2b import Sandbox

PY = os.environ.get("CELLHOST_TEST_PYTHON") or sys.executable


def has_module(name):
    import subprocess

    return subprocess.run([PY, "-c", f"import {name}"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def session():
    with Session(python=PY, tools={"search": lambda q: {"hits": [q.upper()]}}) as s:
        yield s


def test_binary_comes_with_the_wheel():
    from cellhost._host import find_binary

    assert os.path.dirname(find_binary()) == os.path.dirname(sys.executable)
    assert os.path.exists(os.path.join(os.path.dirname(cellhost.__file__), "py.typed"))


def test_state_persists_and_result_fields(session):
    r = session.run("x = 6 * 7\nprint('hi')")
    assert r.status == "ok" and r.stdout == "hi\n" and r.ok
    r = session.run("x")
    assert r.value == "42" and r.result["text/plain"] == "42"
    assert r.kernel["session"] == "default" and r.kernel["generation"] >= 1
    assert r.text.startswith("status: ok") and "--- result ---\n42" in r.text


def test_cell_exception_is_a_result_not_a_raise(session):
    r = session.run("1/0")
    assert r.status == "error" and r.error.ename == "ZeroDivisionError"
    assert "ZeroDivisionError: division by zero" in r.text


def test_streaming_callback(session):
    seen = []
    r = session.run("for i in range(3): print(i, flush=True)", on_output=lambda s, t: seen.append((s, t)))
    assert r.status == "ok"
    assert "".join(t for s, t in seen if s == "stdout") == "0\n1\n2\n"


def test_host_tool_as_callable(session):
    r = session.run("import cellhost\ncellhost.tools.search(q='penguins')")
    assert r.status == "ok", r.text
    assert "PENGUINS" in r.value


def test_interrupt_keeps_state(session):
    session.run("kept = 'yes'")
    box = {}

    def run():
        box["r"] = session.run("import time\nwhile True: time.sleep(0.05)", timeout=120)

    t = threading.Thread(target=run)
    t.start()
    # The interrupt is delivered once the cell runs; until then it says so.
    while True:
        out = session.interrupt()
        if out.get("delivered"):
            break
        time.sleep(0.05)
    t.join()
    assert box["r"].status == "interrupted"
    assert session.run("kept").value == "'yes'"


def test_variables_and_restart(session):
    session.run("v = [1, 2, 3]")
    names = {v["name"] for v in session.variables()}
    assert "v" in names
    session.restart()
    assert session.run("'v' in globals()").value == "False"


def test_busy_session_raises_typed_error(session):
    t = threading.Thread(target=lambda: session.run("import time; time.sleep(3)"))
    t.start()
    try:
        while not any(s.get("busy") for s in session._host.call("GET", "/v1/sessions")["sessions"]):
            time.sleep(0.02)
        with pytest.raises(cellhost.SessionBusy) as e:
            session.run("1")
        assert e.value.code == "session_busy" and e.value.status == 409
    finally:
        t.join()


@pytest.mark.skipif(not has_module("matplotlib"), reason="the kernel python has no matplotlib")
def test_figure_comes_back_as_image(session):
    r = session.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert r.status == "ok", r.text
    assert r.images and r.images[0].mime == "image/png"
    assert r.images[0].bytes[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_notebook_with_parameters(session, tmp_path):
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["# t"]},
            {"cell_type": "code", "source": ["y = n * 2\n", "y"]},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }
    p = tmp_path / "t.ipynb"
    p.write_text(json.dumps(nb))
    results = session.run_notebook(str(p), parameters={"n": 21})
    assert [r.status for r in results] == ["ok", "ok"] and results[-1].value == "42"


def test_submit_where_the_host_has_it(session):
    try:
        h = session.submit("1 + 1")
    except cellhost.NotSupported as e:
        pytest.skip(f"this host has no POST /v1/sessions/{{name}}/cells: {e}")
    assert h.cell


def test_async_session_and_stream():
    async def main():
        async with AsyncSession(python=PY) as s:
            await s.run("a = 1")
            assert (await s.run("a + 1")).value == "2"
            events = [ev async for ev in s.stream("print('x', flush=True)\n3")]
            assert events[-1][0] == "result" and events[-1][1].value == "3"
            assert any(e == "stream" and d["text"] == "x\n" for e, d in events)

    asyncio.run(main())


def test_e2b_facade():
    with Sandbox(python=PY) as sbx:
        sbx.run_code("x = 1")
        ex = sbx.run_code("print('out')\nx + 1")
        assert ex.text == "2" and ex.logs.stdout == ["out\n"] and ex.error is None
        ex = sbx.run_code("raise ValueError('bad')")
        assert ex.error.name == "ValueError" and ex.error.value == "bad"


def test_bad_arguments_are_refused():
    with pytest.raises(cellhost.InvalidRequest):
        Session(language="r")
    with pytest.raises(cellhost.InvalidRequest):
        Session(placement="k8s")


def test_overhead_over_the_raw_round_trip(session):
    """Figures only (no assertion on time): the median of a trivial cell
    through Session.run and through a raw HTTP request, same host."""
    host = session._host
    body = json.dumps({"code": "1"}).encode()

    def raw():
        req = urllib.request.Request(host.base + "/v1/sessions/default/execute", data=body, method="POST")
        req.add_header("Authorization", f"Bearer {host.token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req) as r:
            r.read()

    for _ in range(5):
        raw()
        session.run("1")
    raw_xs, api_xs = [], []
    for _ in range(100):  # interleaved, so both see the same machine load
        t0 = time.perf_counter()
        raw()
        t1 = time.perf_counter()
        session.run("1")
        t2 = time.perf_counter()
        raw_xs.append(t1 - t0)
        api_xs.append(t2 - t1)
    raw_ms = sorted(raw_xs)[50] * 1000
    api_ms = sorted(api_xs)[50] * 1000
    print(f"\nOVERHEAD trivial cell median: raw HTTP {raw_ms:.2f} ms, Session.run {api_ms:.2f} ms, "
          f"overhead {api_ms - raw_ms:.2f} ms", file=sys.stderr)
    assert api_ms > 0 and raw_ms > 0
