"""OpenAI Agents SDK: ``cellhost_function_tool(session)``, a strict-schema
``FunctionTool`` running Python with state kept across calls."""

from __future__ import annotations

from agents import FunctionTool, function_tool

from ..session import Session


def cellhost_function_tool(session: Session) -> FunctionTool:
    """The tool over ``session``."""

    @function_tool(name_override="run_python", strict_mode=True)
    def run_python(code: str) -> str:
        """Run Python code in a persistent kernel; variables survive between calls.

        Args:
            code: Python source of one cell; the last expression's value is returned.
        """
        return session.run(code).text

    return run_python
