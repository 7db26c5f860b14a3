"""Adapters for agent frameworks; each keeps state across calls (one
:class:`~cellhost.Session` for the adapter's lifetime). Import the one you
use — each needs its framework installed:

- :mod:`cellhost.adapters.smolagents`: ``CellhostExecutor``, a smolagents ``PythonExecutor``;
- :mod:`cellhost.adapters.langchain`: ``CellhostTool`` and ``CellhostToolkit``;
- :mod:`cellhost.adapters.pydantic_ai`: ``cellhost_toolset`` (a ``FunctionToolset``);
- :mod:`cellhost.adapters.openai_agents`: ``cellhost_function_tool`` (a ``FunctionTool``).
"""
