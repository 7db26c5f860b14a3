"""The host-tool command cellhost runs for a tool registered as a Python
callable (``Session(tools=...)``): reads the call (``{"name", "args",
"session", "cell"}``) on stdin, hands it to the session's
:class:`~cellhost._host.ToolServer` over its Unix socket, prints the answer.

Usage: ``python PATH/TO/_toolbridge.py SOCKET``.
"""

import json
import socket
import sys


def main() -> int:
    request = sys.stdin.buffer.read()
    try:
        json.loads(request)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sys.argv[1])
            s.sendall(request.strip() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
    except (OSError, ValueError, IndexError) as e:
        answer = json.dumps({"error": f"the session's tool server is unreachable: {e}"}).encode()
    sys.stdout.buffer.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
