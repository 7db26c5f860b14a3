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
            {"cell_type": "markdown", "metadata": {}, "source": ["# t"]},
            {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": ["n = 1"],
             "outputs": [], "execution_count": None},
            {"cell_type": "code", "metadata": {}, "source": ["y = n * 2\n", "y"], "outputs": [], "execution_count": None},
        ],
        "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    p = tmp_path / "t.ipynb"
    p.write_text(json.dumps(nb))
    run = session.run_notebook(str(p), parameters={"n": 21})
    assert run.ok and run.stop is None
    # The two code cells and the injected-parameters cell after the `parameters` one.
    assert (run.total, run.ran) == (3, 3)
    assert run.notebook["cells"][2]["metadata"]["tags"] == ["injected-parameters"]
    assert "".join(run.outputs()[-1][0]["data"]["text/plain"]) == "42"
    # It ran in this session: its variables are the session's.
    assert session.run("y").value == "42"
    out = tmp_path / "t.executed.ipynb"
    run.save(out)
    assert json.loads(out.read_text()) == run.notebook


def test_run_notebook_stops_at_a_failed_cell_and_runs_scripts(session, tmp_path):
    p = tmp_path / "t.py"
    p.write_text("# %%\nz = 1\n# %%\nraise ValueError('nb')\n# %%\nz = 2\n")
    run = session.run_notebook(p)
    assert not run.ok
    assert run.stop["reason"] == "cell_failed" and run.stop["cell"] == 2 and run.stop["status"] == "error"
    assert run.ran == 2 and session.run("z").value == "1"
    run = session.run_notebook(p, allow_errors=True)
    assert run.ok and session.run("z").value == "2"
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    with pytest.raises(cellhost.InvalidRequest):
        session.run_notebook(bad)


def test_files_round_trip(session, tmp_path):
    data = bytes(range(256)) * 4
    put = session.files.upload("in/data.bin", data)
    assert put["path"] == "in/data.bin" and put["size"] == len(data) and put["replaced"] is False
    assert session.files.upload("in/data.bin", data)["replaced"] is True
    # A cell sees the file in its workdir, and what it writes is there at once.
    r = session.run("d = open('in/data.bin', 'rb').read()\nopen('out.txt', 'w').write(d[:4].hex())\nlen(d)")
    assert r.value == str(len(data))
    assert session.files.download("out.txt") == b"00010203"
    assert session.files.download("in/data.bin") == data
    assert session.files.download("in/data.bin", range=(10, 13)) == data[10:14]
    assert session.files.download("in/data.bin", range=(1020, None)) == data[1020:]
    # Local files both ways, streamed.
    src = tmp_path / "local.txt"
    src.write_text("héllo\n", encoding="utf-8")
    session.files.upload("notes/local.txt", src)
    dst = tmp_path / "back.txt"
    assert session.files.download("notes/local.txt", local=dst) == b""
    assert dst.read_text(encoding="utf-8") == "héllo\n"
    with open(src, "rb") as f:
        session.files.upload("notes/stream.txt", f)
    assert session.files.download("notes/stream.txt") == src.read_bytes()

    top = {e.name: e for e in session.files.list()}
    assert top["in"].type == "dir" and top["out.txt"].type == "file" and top["out.txt"].size == 8
    assert [(e.name, e.size) for e in session.files.list("in")] == [("data.bin", len(data))]

    assert session.files.delete("in/data.bin") == {"path": "in/data.bin", "type": "file"}
    with pytest.raises(cellhost.FileNotFound) as e:
        session.files.download("in/data.bin")
    assert e.value.status == 404 and e.value.code == "file_not_found"
    with pytest.raises(cellhost.FileError):
        session.files.download("out.txt", range=(100, 200))
    with pytest.raises(cellhost.PathRefused):
        session.files.upload("/etc/cellhost-test", b"x")
    with pytest.raises(cellhost.PathRefused):
        session.files.download("in/../../outside.txt")


def test_async_files_and_notebook(tmp_path):
    async def main():
        async with AsyncSession(python=PY) as s:
            await s.files.upload("a.txt", "one")
            assert await s.files.download("a.txt") == b"one"
            assert [e.name for e in await s.files.list()] == ["a.txt"]
            p = tmp_path / "n.py"
            p.write_text("# %%\nk = open('a.txt').read()\n")
            assert (await s.run_notebook(p)).ok
            assert (await s.run("k")).value == "'one'"
            await s.files.delete("a.txt")

    asyncio.run(main())


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


def test_fork_carries_state_and_branches_stay_apart():
    with Session(python=PY, name="trunk") as s:
        s.run("xs = [1, 2]\nopen('f.txt', 'w').write('trunk')")
        count = s.run("len(xs)").execution_count
        with s.fork("branch") as b:
            assert b.fork_report["parent"] == "trunk" and b.fork_report["execution_count"] == count
            r = b.run("xs.append(3); len(xs)")
            assert r.value == "3" and r.execution_count == count + 1
            b.run("open('f.txt', 'w').write('branch')")
            assert s.run("len(xs), open('f.txt').read()").value == "(2, 'trunk')"
            assert b.run("open('f.txt').read()").value == "'branch'"
            with pytest.raises(cellhost.CellhostError) as e:
                s.fork("branch")
            assert e.value.code == "session_exists" and e.value.status == 409
        # The fork's close ends the fork only.
        assert s.run("len(xs)").value == "2"


def test_async_fork():
    async def main():
        async with AsyncSession(python=PY, name="atrunk") as s:
            await s.run("n = 10")
            b = await s.fork("abranch")
            try:
                assert (await b.run("n + 1")).value == "11"
            finally:
                await b.close()

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
        Session(language="julia")
    with pytest.raises(cellhost.InvalidRequest):
        Session(placement="../k8s")
    # A name no config table defines: the host refuses to start, naming it.
    with pytest.raises(cellhost.CellhostError) as e:
        Session(python=PY, placement="k8s")
    assert "k8s" in str(e.value)


def test_session_limits_and_network_go_with_the_session():
    with Session(python=PY, limits={"cell_timeout_s": 2, "pids": 64}, network="off") as s:
        r = s.run("import time\ntime.sleep(30)")
        assert r.status == "timeout", r.raw if hasattr(r, "raw") else r
        listed = s._host.call("GET", "/v1/sessions")
        mine = [x for x in listed["sessions"] if x.get("name") == "default"]
        assert mine and mine[0]["limits"]["pids"] == 64, listed


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


def test_a_placement_is_the_sessions_own(tmp_path, monkeypatch):
    # A loopback placement: the kernel runs under a `cellhost agent` that
    # dials the host back over TLS, as on a Slurm or SSH node.
    binary = cellhost._host.find_binary()
    config = tmp_path / "cellhost.toml"
    config.write_text(f'[placement.lo]\nkind = "loopback"\nprogram = {json.dumps(binary)}\n')
    monkeypatch.setenv("CELLHOST_CONFIG", str(config))
    with Session(python=PY, placement="lo") as s:
        r = s.run("6 * 7")
        assert r.status == "ok" and r.value == "42", r
        listed = s._host.call("GET", "/v1/sessions")
        mine = [x for x in listed["sessions"] if x["name"] == "default"]
        assert mine and mine[0]["placement"]["name"] == "lo", listed
        assert mine[0]["placement"]["kind"] == "loopback", listed


def test_a_session_with_checkpoints_comes_back_after_its_kernel_is_killed():
    import signal

    with Session(python=PY, checkpoint="namespace") as s:
        assert s.run("data = list(range(1000))\nlabel = 'kept'").ok
        # The checkpoint is written after the result; the next cell waits for it.
        assert s.run("len(data)").value == "1000"
        # The worker's pid as the host sees it (in the sandbox it is 2).
        pid = s.run("1").kernel["pid"]
        os.kill(int(pid), signal.SIGKILL)
        r = s.run("label, sum(data)")
        assert r.ok, r.text
        assert r.value == "('kept', 499500)", r.text
        assert r.restored is not None and r.restored["source"] == "checkpoint", r.raw
        assert "data" in r.restored["restored"] and "label" in r.restored["restored"], r.restored
    with pytest.raises(cellhost.CellhostError):
        Session(python=PY, checkpoint="sometimes")


def test_a_session_with_restore_replay_gets_its_cells_back_after_its_kernel_is_killed():
    with Session(python=PY, restore="replay") as s:
        first = s.run("data = list(range(1000))\nprint('built')")
        assert first.ok, first.text
        second = s.run("label = 'kept'")
        assert second.ok, second.text
        # The kernel SIGKILLed mid-cell (the cell kills its own worker).
        killed = s.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert killed.status == "crashed", killed.text
        r = s.run("label, sum(data)")
        assert r.ok, r.text
        assert r.value == "('kept', 499500)", r.text
        assert "built" not in r.stdout, r.raw
        assert r.restored is not None and r.restored["source"] == "replay", r.raw
        replayed = [c["cell"] for c in r.restored["replay"]["replayed"]]
        assert replayed[:2] == [first.cell_id, second.cell_id], r.restored
    with pytest.raises(cellhost.CellhostError):
        Session(python=PY, restore="sometimes")


def test_a_paused_session_is_listed_paused_and_resumes():
    with Session(python=PY, name="held") as s:
        assert s.run("kept = 41 + 1").ok
        report = s.pause()
        assert "kept" in report["checkpoint"]["saved"], report
        mine = [x for x in s.sessions() if x["name"] == "held"]
        assert mine and mine[0]["state"] == "paused", mine
        assert mine[0]["paused_ms"] > 0 and mine[0]["checkpoint"]["saved"], mine
        r = s.run("kept")
        assert r.value == "42" and r.restored["resumed"], r.raw
        assert [x["state"] for x in s.sessions() if x["name"] == "held"] == ["live"]
