"""The framework adapters against the real PyPI packages (pinned in
scripts/test-adapters.sh), driven through their own tool/executor
interfaces with no language model. Each test skips when its framework is
not installed in the venv. The kernels run this venv's interpreter (the
smolagents tool definitions import smolagents in the kernel)."""

import asyncio
import json
import sys

import pytest

from cellhost import Session

PY = sys.executable


def test_smolagents_executor_state_and_final_answer():
    pytest.importorskip("smolagents")
    from smolagents.default_tools import FinalAnswerTool
    from smolagents.utils import AgentError

    from cellhost.adapters.smolagents import CellhostExecutor

    ex = CellhostExecutor(python=PY)
    try:
        ex.send_tools({"final_answer": FinalAnswerTool()})
        ex.send_variables({"start": 40})
        out = ex("x = start + 2\nprint('step one')")
        assert not out.is_final_answer and "step one" in out.logs
        out = ex("x")
        assert out.output == "42"
        with pytest.raises(AgentError) as e:
            ex("1/0")
        assert "ZeroDivisionError" in str(e.value)
        out = ex("final_answer(x * 10)")
        assert out.is_final_answer and out.output == 420
    finally:
        ex.cleanup()


def test_langchain_tool_and_toolkit_keep_state():
    pytest.importorskip("langchain_core")
    from cellhost.adapters.langchain import CellhostToolkit

    kit = CellhostToolkit(python=PY)
    try:
        run, variables, restart = kit.get_tools()
        assert run.invoke({"code": "df = {'a': 1}"}).startswith("status: ok")
        assert "--- result ---\n1" in run.invoke({"code": "df['a']"})
        assert run.invoke({"code": "1/0"}).startswith("status: error")
        assert "df: dict" in variables.invoke({})
        assert "restarted" in restart.invoke({})
        assert "NameError" in run.invoke({"code": "df"})
    finally:
        kit.session.close()


def test_pydantic_ai_toolset_keeps_state_and_spends_no_retry():
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from cellhost.adapters.pydantic_ai import cellhost_toolset

    steps = ["x = 21", "1/0", "x * 2"]

    def model(messages, info):
        done = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        if done < len(steps):
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": steps[done]}, tool_call_id=f"c{done}")])
        return ModelResponse(parts=[TextPart("done")])

    with Session(python=PY) as s:
        agent = Agent(FunctionModel(model), toolsets=[cellhost_toolset(s)], retries=0)
        result = agent.run_sync("compute")
        parts = [p for m in result.all_messages() for p in m.parts]
        returns = [p.content for p in parts if isinstance(p, ToolReturnPart)]
        assert not any(isinstance(p, RetryPromptPart) for p in parts)
        assert returns[1].startswith("status: error") and "ZeroDivisionError" in returns[1]
        assert "--- result ---\n42" in returns[2]


def test_openai_agents_function_tool_strict_and_stateful():
    pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    from cellhost.adapters.openai_agents import cellhost_function_tool

    with Session(python=PY) as s:
        tool = cellhost_function_tool(s)
        assert tool.strict_json_schema
        schema = json.dumps(tool.params_json_schema)
        assert '"null"' not in schema and tool.params_json_schema["additionalProperties"] is False

        async def call(code):
            args = json.dumps({"code": code})
            ctx = ToolContext(context=None, tool_name="run_python", tool_call_id="t", tool_arguments=args)
            return await tool.on_invoke_tool(ctx, args)

        async def main():
            await call("y = 5")
            return await call("y + 1")

        assert "--- result ---\n6" in asyncio.run(main())
