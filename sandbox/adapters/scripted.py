"""A scripted model for the OpenAI Agents SDK, for tests and examples without a network: it
asks for the given tool calls in turn, then answers `final`, and records what it was offered and
what the tools answered. (LangChain and PydanticAI ship their own: `GenericFakeChatModel`,
`FunctionModel`.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText


class ScriptedModel(Model):
    """Plays `calls` (tool name, arguments), one per turn, then answers `final`."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], final: str = "done") -> None:
        self.calls = list(calls)
        self.final = final
        self.offered: list[set[str]] = []  # the tool names of each turn
        self.tool_outputs: list[str] = []  # what the tools answered, in order
        self._turn = 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        tools = args[2] if len(args) > 2 else kwargs.get("tools", [])
        self.offered.append({t.name for t in tools})
        if isinstance(input, list):
            self.tool_outputs = [
                str(item.get("output"))
                for item in input
                if isinstance(item, dict) and item.get("type") == "function_call_output"
            ]
        if self._turn < len(self.calls):
            name, arguments = self.calls[self._turn]
            self._turn += 1
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{self._turn}", name=name, arguments=json.dumps(arguments),
                id=f"fc_{self._turn}", status="completed",
            )  # fmt: skip
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=self.final, annotations=[])
        message = ResponseOutputMessage(
            id="msg_final", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")
