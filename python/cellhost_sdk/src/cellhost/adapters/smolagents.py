"""A smolagents ``PythonExecutor`` on a cellhost session:
``CodeAgent(..., executor=CellhostExecutor())``, or drive it directly.
State persists across steps; ``final_answer(x)`` ends the run with ``x``."""

from __future__ import annotations

from typing import Any, Optional

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ..e2b import Sandbox


class CellhostExecutor(RemotePythonExecutor):
    """Runs each code action as a cell of one persistent session (through
    the E2B-compatible facade, so final answers travel the way smolagents'
    remote executors expect)."""

    def __init__(self, additional_imports: Optional[list] = None, logger: Any = None, **session: Any):
        super().__init__(additional_imports or [], logger or AgentLogger(level=LogLevel.ERROR))
        self.sandbox = Sandbox(**session)

    def install_packages(self, additional_imports: list) -> list:
        """Packages are the kernel interpreter's; nothing is installed."""
        return list(additional_imports)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        ex = self.sandbox.run_code(code)
        logs = "\n".join(ex.logs.stdout)
        if ex.error:
            if ex.error.name == RemotePythonExecutor.FINAL_ANSWER_EXCEPTION:
                return CodeOutput(
                    output=self._deserialize_final_answer(ex.error.value, self.allow_pickle),
                    logs=logs,
                    is_final_answer=True,
                )
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{ex.error.name}\n{ex.error.value}\n{ex.error.traceback}",
                self.logger,
            )
        return CodeOutput(output=ex.text, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Ends the session."""
        self.sandbox.kill()
