"""MCP clients of `cellhost serve --mcp-sessions caller` at /mcp, with the
bearer token: LangChain's MCP adapter (a new MCP session per tool call by
default) and pydantic-ai's MCP toolset. State must survive across calls,
and a cell's exception must be a result saying `status: error`, not a
tool failure (no model retry)."""

import asyncio
import sys

import pytest

from cellhost._host import Host

PY = sys.executable


@pytest.fixture(scope="module")
def host():
    h = Host(python=PY, serve_args=["--mcp-sessions", "caller"])
    yield h
    h.close()


def text(content):
    """The text of a LangChain tool answer (a string, or content blocks)."""
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)


def test_langchain_mcp_adapter_keeps_state_across_connections(host):
    pytest.importorskip("langchain_mcp_adapters")
    from langchain_mcp_adapters.client import MultiServerMCPClient

    client = MultiServerMCPClient({
        "cellhost": {
            "url": host.base + "/mcp",
            "transport": "streamable_http",
            "headers": {"Authorization": f"Bearer {host.token}"},
        }
    })

    async def main():
        tools = {t.name: t for t in await client.get_tools()}
        run = tools["execute_code"]
        await run.ainvoke({"code": "lc = 'kept'", "session": "lc"})
        second = await run.ainvoke({"code": "lc", "session": "lc"})
        error = await run.ainvoke({"code": "1/0", "session": "lc"})
        return text(second), text(error)

    second, error = asyncio.run(main())
    assert "'kept'" in second, second
    assert "status: error" in error and "ZeroDivisionError" in error, error


def test_pydantic_ai_mcp_toolset_state_and_no_retry(host):
    pytest.importorskip("fastmcp")
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    steps = ["p = 20", "1/0", "p + 22"]

    def model(messages, info):
        done = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        if done < len(steps):
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": steps[done], "session": "pa"},
                                                     tool_call_id=f"c{done}")])
        return ModelResponse(parts=[TextPart("done")])

    # The default tool_error_behavior ("retry") turns an isError result into
    # a model retry: a cell's exception must not be one.
    server = MCPToolset(host.base + "/mcp", headers={"Authorization": f"Bearer {host.token}"})
    agent = Agent(FunctionModel(model), toolsets=[server], retries=0)
    result = agent.run_sync("compute")
    parts = [p for m in result.all_messages() for p in m.parts]
    assert not any(isinstance(p, RetryPromptPart) for p in parts)
    # pydantic-ai hands the model the structured content (the CellResult).
    returns = [p.content for p in parts if isinstance(p, ToolReturnPart)]
    assert returns[1]["status"] == "error" and returns[1]["error"]["ename"] == "ZeroDivisionError", returns[1]
    assert returns[2]["status"] == "ok" and returns[2]["result"]["text/plain"] == "42", returns[2]
