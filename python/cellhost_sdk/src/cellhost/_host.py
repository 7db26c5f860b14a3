"""The host process a :class:`~cellhost.Session` talks to.

The package ships the ``cellhost`` binary (the wheel's script) and starts
``cellhost serve`` on a loopback port the OS picks, with a fresh random
token in a private (0700) state directory, so no other user or process
without the token can use it. Requests go over the HTTP API (JSON, and
server-sent events for streaming); host tools are served back to the
kernel through a Unix socket in that directory (:mod:`cellhost._toolbridge`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from .errors import CellhostError, HostError, from_envelope

READY = "cellhost: serving http://"


def find_binary() -> str:
    """The ``cellhost`` binary: ``CELLHOST_BIN``, else the one this
    package's wheel installed next to the interpreter, else ``PATH``."""
    env = os.environ.get("CELLHOST_BIN")
    if env:
        return os.path.abspath(env)
    here = os.path.join(sysconfig.get_path("scripts"), "cellhost")
    if os.access(here, os.X_OK):
        return here
    beside = os.path.join(os.path.dirname(sys.executable), "cellhost")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("cellhost")
    if found:
        return found
    raise HostError("host_unavailable", "no cellhost binary (install the wheel or set CELLHOST_BIN)")


class ToolServer:
    """Answers the kernel's host-tool calls with Python callables: one JSON
    request a connection on a Unix socket, one JSON answer back."""

    def __init__(self, path: str, tools: Mapping[str, Callable[..., Any]]):
        self.path = path
        self.tools = dict(tools)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, name="cellhost-tools", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            try:
                req = json.loads(data.decode("utf-8"))
                fn = self.tools[req["name"]]
                args = req.get("args") or {}
                value = fn(**args) if isinstance(args, dict) else fn(*args)
                out = json.dumps(value, default=str)
            except KeyError as e:
                out = json.dumps({"error": f"no host tool {e}"})
            except Exception as e:  # the tool's own failure goes back to the cell
                out = json.dumps({"error": f"{type(e).__name__}: {e}"})
            try:
                conn.sendall(out.encode("utf-8") + b"\n")
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class Host:
    """One ``cellhost serve`` process and an HTTP client of it."""

    def __init__(
        self,
        python: Optional[str] = None,
        sandbox: Optional[str] = None,
        limits: Optional[Mapping[str, Any]] = None,
        tools: Optional[Mapping[str, Callable[..., Any]]] = None,
        env: Optional[Mapping[str, str]] = None,
        serve_args: Optional[List[str]] = None,
    ):
        """``serve_args`` are more arguments of ``cellhost serve`` (e.g.
        ``["--mcp-sessions", "caller"]`` for MCP clients at ``base + "/mcp"``)."""
        self.dir = tempfile.mkdtemp(prefix="cellhost-")
        os.chmod(self.dir, 0o700)
        self.token = secrets.token_hex(32)
        tokens = os.path.join(self.dir, "tokens")
        fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"sdk {self.token} rw\n")
        self.tools: Optional[ToolServer] = None
        child_env = dict(os.environ)
        child_env["CELLHOST_STATE_DIR"] = os.path.join(self.dir, "state")
        for key, value in (limits or {}).items():
            if not key.replace("_", "").isalnum():
                raise ValueError(f"limits: {key!r} is not a config key")
            child_env["CELLHOST_" + key.upper()] = str(value)
        if tools:
            for name in tools:
                if not name.isidentifier():
                    raise ValueError(f"tools: {name!r} is not an identifier")
            self.tools = ToolServer(os.path.join(self.dir, "tools.sock"), tools)
            # The bridge is stdlib only: run as a file, it needs no import path
            # (the host runs tools with a clean environment).
            bridge = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_toolbridge.py")
            command = [sys.executable, bridge, self.tools.path]
            child_env["CELLHOST_TOOLS"] = "\n".join(
                f"{name} = {{ command = {json.dumps(command)} }}" for name in tools
            )
        child_env.update(env or {})
        args = [find_binary(), "serve", "--listen", "127.0.0.1:0", "--token-file", tokens]
        if python:
            args += ["--python", str(python)]
        if sandbox:
            args += ["--sandbox", sandbox]
        args += list(serve_args or [])
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env,
            cwd=self.dir,
        )
        self.log: List[str] = []
        self.base = self._wait_ready()
        threading.Thread(target=self._drain, name="cellhost-log", daemon=True).start()

    def _wait_ready(self) -> str:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(line)
            if line.startswith(READY):
                addr = line[len(READY):].split("/", 1)[0]
                return f"http://{addr}"
        self.proc.wait()
        self.close()
        raise HostError("host_unavailable", "cellhost serve exited: " + " | ".join(self.log[-10:]))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.log.append(raw.decode("utf-8", "replace").rstrip("\n"))
            del self.log[:-200]

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: Optional[float] = 60,
        stream: bool = False,
        data: Any = None,
        headers: Optional[Mapping[str, str]] = None,
    ):
        """Sends one request: ``body`` as JSON, or ``data`` as it is (bytes
        or a binary file object, streamed); an error answer raised as its
        :class:`CellhostError`."""
        if body is not None:
            data = json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if stream:
            req.add_header("Accept", "text/event-stream")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise from_envelope(e.code, parsed) from None
        except (urllib.error.URLError, OSError) as e:
            raise HostError("host_unavailable", f"cannot reach the host: {e}") from None

    def raw(self, method: str, path: str, data: Any, headers: Mapping[str, str], timeout: Optional[float] = 300):
        """A request whose body (``data``) and answer are bytes, not JSON:
        the open response (a context manager)."""
        return self._request(method, path, None, timeout, data=data, headers=headers)

    @staticmethod
    def parse(raw: bytes) -> Any:
        """An answer's JSON (``None`` when empty)."""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CellhostError("internal", f"the host answered no JSON: {raw[:200]!r}") from None

    def call(self, method: str, path: str, body: Any = None, timeout: Optional[float] = 60) -> Any:
        """One JSON request; the parsed answer (``None`` for 204)."""
        with self._request(method, path, body, timeout) as resp:
            return self.parse(resp.read())

    def events(self, path: str, body: Any, timeout: Optional[float]) -> Iterator[Tuple[str, Any]]:
        """A server-sent event stream: (event, parsed data) pairs."""
        resp = self._request("POST", path, body, timeout, stream=True)
        with resp:
            event, data = "message", []
            for raw in resp:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, json.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith(":"):
                    continue
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])

    def close(self) -> None:
        """Stops the host (its kernels end with it) and removes its directory."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tools:
            self.tools.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def raise_for_event(event: str, data: Any) -> None:
    """An ``error`` event of a stream as its exception."""
    if event == "error":
        raise from_envelope(0, data)


__all__ = ["Host", "CellhostError", "find_binary"]
