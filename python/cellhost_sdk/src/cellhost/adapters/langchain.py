"""LangChain: ``CellhostTool`` (run Python, state kept across calls) and
``CellhostToolkit`` (run, list variables, restart) over one session."""

from __future__ import annotations

from typing import Any, List, Optional, Type

from langchain_core.tools import BaseTool, BaseToolkit
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ..session import Session


class _Code(BaseModel):
    code: str = Field(description="Python source of one cell; the last expression's value is returned.")


class _Nothing(BaseModel):
    pass


class CellhostTool(BaseTool):
    """Runs Python in a persistent kernel; returns the agent-facing text
    (status first). A cell's exception is part of that text, not a raised error."""

    name: str = "python"
    description: str = (
        "Run Python code in a persistent kernel: variables and imports survive between calls. "
        "Returns the status, stdout, stderr, the last expression's value and any error."
    )
    args_schema: Type[BaseModel] = _Code
    model_config = ConfigDict(arbitrary_types_allowed=True)
    session: Any = None

    def _run(self, code: str, run_manager: Optional[Any] = None) -> str:
        return self.session.run(code).text


class _VariablesTool(BaseTool):
    name: str = "list_variables"
    description: str = "List the variables of the Python session: name, type, shape, preview."
    args_schema: Type[BaseModel] = _Nothing
    session: Any = None

    def _run(self, run_manager: Optional[Any] = None) -> str:
        return "\n".join(f"{v.get('name')}: {v.get('type')}" for v in self.session.variables())


class _RestartTool(BaseTool):
    name: str = "restart"
    description: str = "Restart the Python kernel: every variable is dropped."
    args_schema: Type[BaseModel] = _Nothing
    session: Any = None

    def _run(self, run_manager: Optional[Any] = None) -> str:
        r = self.session.restart()
        return f"restarted: kernel generation {r.get('generation')}"


class CellhostToolkit(BaseToolkit):
    """The three tools over one session (``CellhostToolkit(session=...)``,
    or ``**kwargs`` for a new :class:`~cellhost.Session`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _session: Session = PrivateAttr()

    def __init__(self, session: Optional[Session] = None, **kwargs: Any):
        super().__init__()
        self._session = session or Session(**kwargs)

    @property
    def session(self) -> Session:
        return self._session

    def get_tools(self) -> List[BaseTool]:
        return [
            CellhostTool(session=self._session),
            _VariablesTool(session=self._session),
            _RestartTool(session=self._session),
        ]
