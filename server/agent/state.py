"""A run's state and the decisions about it, free of I/O.

The coordinator and the loop hold a `Run`, ask these functions what to do
(next step after a model turn; whether a `tool.result` is accepted), and do
the awaiting themselves. That keeps the rules testable without sockets.
"""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from protocol.client import RunContext, ToolResult
from protocol.codes import ErrorCode
from protocol.server import PendingItem, RunSnapshot, RunStatus, ToolDoneStatus
from server.agent.llm import ToolCallRequest
from server.agent.tools import ToolBox
from server.auth import Authenticator, CallGrant


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class ToolOutcome:
    status: ToolDoneStatus
    output: Any = None
    error: dict[str, Any] | None = None

    def for_model(self) -> str:
        """What the model reads as the tool message."""
        if self.status == "ok":
            return orjson.dumps(self.output).decode()
        if self.status == "rejected":
            return orjson.dumps({"error": "rejected by the user", **(self.error or {})}).decode()
        return orjson.dumps({"error": self.error or {"message": self.status}}).decode()


@dataclass
class PendingCall:
    call_id: str
    name: str
    arguments: dict[str, Any]
    kind: Literal["tool", "approval"]
    executor: Literal["client", "server"]
    expires_at: int
    future: "asyncio.Future[Any]"
    token: str | None = None
    answered: bool = False  # a result or decision was accepted; the run task takes it from here

    def item(self, include_token: bool) -> PendingItem:
        return PendingItem(
            kind=self.kind, call_id=self.call_id, name=self.name, arguments=self.arguments,
            token=self.token if include_token else None, expires_at=self.expires_at,
        )


@dataclass
class Run:
    run_id: str
    document_id: str
    mode: Literal["agent", "chat"]
    user_id: str
    client_id: str
    prompt: str
    context: RunContext | None
    tools: ToolBox
    max_steps: int
    model: str
    status: RunStatus = "running"
    step: int = 0
    pending: dict[str, PendingCall] = field(default_factory=dict)
    call_ids: set[str] = field(default_factory=set)
    completed_calls: set[str] = field(default_factory=set)  # client calls with a result
    approved_names: set[str] = field(default_factory=set)
    usage: dict[str, int] = field(default_factory=dict)
    finishing: bool = False
    message_id: str | None = None
    message_parts: list[str] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return not self.finishing

    def waiting_on_executor(self) -> bool:
        return any(p.kind == "approval" or p.executor == "client" for p in self.pending.values())

    def snapshot(self, for_user: str | None) -> RunSnapshot:
        include_token = for_user == self.user_id
        return RunSnapshot(
            run_id=self.run_id, status=self.status, mode=self.mode, user_id=self.user_id,
            client_id=self.client_id, step=self.step,
            pending=[p.item(include_token) for p in self.pending.values()],
        )

    def add_usage(self, usage: dict[str, int]) -> None:
        for key, value in usage.items():
            if isinstance(value, int):
                self.usage[key] = self.usage.get(key, 0) + value

    def grant(self, call_id: str, user_id: str, expires_at: int) -> CallGrant:
        return CallGrant(self.run_id, call_id, user_id, self.document_id, expires_at)


# -- what to do after a model turn -------------------------------------------------
@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class ExecuteTools:
    calls: list[ToolCallRequest]


@dataclass(frozen=True)
class Fail:
    reason: str
    message: str


NextStep = Completed | ExecuteTools | Fail


def next_step_after_turn(
    tool_calls: list[ToolCallRequest], steps_done: int, max_steps: int
) -> NextStep:
    """A turn without tool calls completes the run; one with tool calls runs them,
    unless it was the last model call the run may make."""
    if not tool_calls:
        return Completed()
    if steps_done >= max_steps:
        return Fail("max_steps", f"the model still asked for tools after {max_steps} model calls")
    return ExecuteTools(tool_calls)


# -- whether a tool.result is accepted ---------------------------------------------
@dataclass(frozen=True)
class Accept:
    pending: PendingCall


@dataclass(frozen=True)
class Duplicate:
    pass


@dataclass(frozen=True)
class Refuse:
    code: ErrorCode
    message: str


ResultVerdict = Accept | Duplicate | Refuse


def judge_tool_result(
    run: Run, message: ToolResult, user_id: str, auth: Authenticator, at_ms: int
) -> ResultVerdict:
    pending = run.pending.get(message.call_id)
    if pending is None or pending.kind != "tool" or pending.executor != "client":
        if message.call_id in run.completed_calls:
            grant = run.grant(message.call_id, user_id, at_ms)
            problem = auth.check_call_token(message.token, grant, 0)
            if problem is None:
                return Duplicate()
            return Refuse(ErrorCode.INVALID_TOKEN, problem)
        return Refuse(ErrorCode.CALL_NOT_PENDING, f"call {message.call_id!r} is not pending")
    problem = auth.check_call_token(message.token, run.grant(message.call_id, user_id, 0), at_ms)
    if problem is not None:
        return Refuse(ErrorCode.INVALID_TOKEN, problem)
    return Accept(pending)
