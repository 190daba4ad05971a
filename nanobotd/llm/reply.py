"""What a completion gives back: the reply and its tool calls, parsed and checked, and the usage meter. Strict: a reply
we cannot use raises LLMBadResponse, so jobs only see well-formed content and tool calls with JSON-object arguments."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from nanobotd.llm.failures import BAD_RESPONSE, LLMBadResponse


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant reply, arguments already parsed into a JSON object."""

    id: str
    name: str
    arguments: dict
    raw_arguments: str


@dataclass(frozen=True)
class LLMReply:
    """What a completion gave us, plus the cost of getting it."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int

    def assistant_message(self) -> dict:
        """The OpenAI-format assistant message to append to the conversation before tool results."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.content}
        return {"role": "assistant", "content": self.content or None,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.raw_arguments}}
                               for call in self.tool_calls]}


@dataclass
class UsageMeter:
    """Token, latency and error totals of one run, for its manifest and for status."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    retries: int = 0
    error_types: dict[str, int] = field(default_factory=dict)

    def add(self, reply: LLMReply) -> None:
        """Count a successful completion."""
        self.calls += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.latencies_ms.append(reply.latency_ms)
        self.retries += max(reply.attempts - 1, 0)

    def add_error(self, error: Exception) -> None:
        """Count a call that ended in an error."""
        self.errors += 1
        name = type(error).__name__
        self.error_types[name] = self.error_types.get(name, 0) + 1
        self.retries += max(getattr(error, "attempts", 0) - 1, 0)

    def to_json(self) -> dict:
        """A JSON-ready summary."""
        return {**asdict(self), "latencies_ms": [round(latency, 1) for latency in self.latencies_ms]}


def parse_reply(data: dict, *, latency_ms: float, attempts: int) -> LLMReply:
    """Turn an OpenAI-format completion into an LLMReply, or raise LLMBadResponse."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMBadResponse("response has no choices", kind=BAD_RESPONSE)
    message = choices[0].get("message") or {}
    if not isinstance(message, dict):
        raise LLMBadResponse("response message is not an object", kind=BAD_RESPONSE)
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    elif not isinstance(content, (str, type(None))):
        raise LLMBadResponse(f"message content of type {type(content).__name__}", kind=BAD_RESPONSE)
    usage = data.get("usage") or {}
    return LLMReply(content=content or "", finish_reason=str(choices[0].get("finish_reason") or ""),
                    tool_calls=tuple(parse_tool_call(call, index)
                                     for index, call in enumerate(message.get("tool_calls") or ())),
                    prompt_tokens=int(usage.get("prompt_tokens") or 0),
                    completion_tokens=int(usage.get("completion_tokens") or 0), latency_ms=latency_ms,
                    attempts=attempts)


def parse_tool_call(call: Any, index: int) -> ToolCall:
    """One tool call; arguments must be a JSON object (an empty string counts as {})."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not name:
        raise LLMBadResponse(f"tool call {index} has no function name", kind=BAD_RESPONSE)
    raw = function.get("arguments")
    raw = json.dumps(raw) if isinstance(raw, dict) else raw if isinstance(raw, str) else ""
    try:
        arguments = json.loads(raw) if raw.strip() else {}
    except ValueError as error:
        raise LLMBadResponse(f"tool call {name!r} arguments are not valid JSON: {error}", kind=BAD_RESPONSE) from error
    if not isinstance(arguments, dict):
        raise LLMBadResponse(f"tool call {name!r} arguments are not a JSON object", kind=BAD_RESPONSE)
    return ToolCall(id=call.get("id") or f"call_{index}", name=name, arguments=arguments, raw_arguments=raw)
