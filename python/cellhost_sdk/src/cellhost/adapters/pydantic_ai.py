"""pydantic-ai: ``cellhost_toolset(session)``, a ``FunctionToolset`` with
``run_python`` (state kept across calls). A cell's exception is returned
as the text saying ``status: error`` — not a ``ModelRetry`` — so it does
not spend the agent's retry budget."""

from __future__ import annotations

from pydantic_ai.toolsets import FunctionToolset

from ..session import Session


def cellhost_toolset(session: Session) -> FunctionToolset:
    """The toolset over ``session``."""

    def run_python(code: str) -> str:
        """Run Python code in a persistent kernel; variables survive between calls.

        Args:
            code: Python source of one cell; the last expression's value is returned.
        """
        return session.run(code).text

    def list_variables() -> str:
        """List the variables of the Python session."""
        return "\n".join(f"{v.get('name')}: {v.get('type')}" for v in session.variables())

    return FunctionToolset(tools=[run_python, list_variables])
