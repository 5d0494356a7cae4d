"""Running one checked tool call: approval first when required, then the client
or the server executes it, each wait bounded by its timeout.

This is the `RunHost.run_tool` half of the coordinator, kept apart so the
message-routing half stays readable.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from protocol.server import ApprovalRequested, ToolCall, ToolDone
from server.agent.state import PendingCall, Run, ToolOutcome, now_ms
from server.agent.tools import CheckedCall

if TYPE_CHECKING:
    from server.agent.coordinator import RunCoordinator

logger = logging.getLogger("cowrite.agent")


@dataclass(frozen=True)
class ApprovalAnswer:
    decision: Literal["approve", "reject"]
    arguments: dict[str, Any]
    reason: str | None = None


class ToolDispatcher:
    def __init__(self, coordinator: "RunCoordinator") -> None:
        self.coordinator = coordinator
        self.settings = coordinator.services.settings

    async def run_tool(self, run: Run, call_id: str, call: CheckedCall) -> ToolOutcome:
        arguments = call.arguments
        if call.requires_approval and call.name not in run.approved_names:
            answer = await self._approval(run, call_id, call)
            if isinstance(answer, ToolOutcome):
                return answer
            arguments = answer.arguments
        if call.executor == "server":
            return await self._server_call(run, call_id, call.name, arguments)
        return await self._client_call(run, call_id, call.name, arguments)

    async def _open(self, run: Run, pending: PendingCall) -> None:
        """Register the call before announcing it, so every snapshot (and the
        shared run record a survivor reads if this instance dies) lists it."""
        run.pending[pending.call_id] = pending
        run.status = "waiting_approval" if pending.kind == "approval" else "waiting_tool"
        self.coordinator.update_grace(run)
        await self.coordinator.share_state(run)

    async def _wait(self, run: Run, pending: PendingCall, timeout_s: float) -> Any:
        """Wait for the answer; None on timeout. The pending entry is removed either way."""
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
        except TimeoutError:
            return None
        finally:
            if not run.finishing:
                run.pending.pop(pending.call_id, None)
                run.status = "running"
                self.coordinator.update_grace(run)

    async def _approval(self, run: Run, call_id: str, call: CheckedCall
                        ) -> ApprovalAnswer | ToolOutcome:
        expires_at = now_ms() + int(self.settings.approval_timeout_s * 1000)
        pending = PendingCall(
            call_id, call.name, call.arguments, "approval", call.executor, expires_at,
            asyncio.get_running_loop().create_future(),
        )
        await self._open(run, pending)
        await self.coordinator.emit(run, ApprovalRequested(
            run_id=run.run_id, call_id=call_id, name=call.name, arguments=call.arguments,
            expires_at=expires_at))
        answer = await self._wait(run, pending, self.settings.approval_timeout_s)
        if answer is None:
            error = {"message": "the approval timed out", "code": "approval_timeout"}
            await self.coordinator.emit(run, ToolDone(
                run_id=run.run_id, call_id=call_id, status="timeout", error=error))
            return ToolOutcome("timeout", error=error)
        assert isinstance(answer, ApprovalAnswer)
        if answer.decision == "reject":
            error = {"message": "rejected by the user"}
            if answer.reason:
                error["reason"] = answer.reason
            await self.coordinator.emit(run, ToolDone(
                run_id=run.run_id, call_id=call_id, status="rejected", error=error))
            return ToolOutcome("rejected", error=error)
        return answer

    async def _client_call(self, run: Run, call_id: str, name: str, arguments: dict[str, Any]
                           ) -> ToolOutcome:
        expires_at = now_ms() + int(self.settings.tool_timeout_s * 1000)
        token = self.coordinator.services.auth.issue_call_token(
            run.grant(call_id, run.user_id, expires_at))
        pending = PendingCall(
            call_id, name, arguments, "tool", "client", expires_at,
            asyncio.get_running_loop().create_future(), token=token,
        )
        await self._open(run, pending)
        await self.coordinator.emit(run, ToolCall(
            run_id=run.run_id, call_id=call_id, name=name, arguments=arguments,
            executor="client", client_id=run.client_id, token=token, expires_at=expires_at))
        outcome = await self._wait(run, pending, self.settings.tool_timeout_s)
        if outcome is None:
            error = {"message": f"no result within {self.settings.tool_timeout_s:g} s",
                     "code": "tool_timeout"}
            await self.coordinator.emit(run, ToolDone(
                run_id=run.run_id, call_id=call_id, status="timeout", error=error))
            return ToolOutcome("timeout", error=error)
        assert isinstance(outcome, ToolOutcome)
        return outcome  # tool.done was published when the result was accepted

    async def _server_call(self, run: Run, call_id: str, name: str, arguments: dict[str, Any]
                           ) -> ToolOutcome:
        await self.coordinator.emit(run, ToolCall(
            run_id=run.run_id, call_id=call_id, name=name, arguments=arguments,
            executor="server"))
        run.status = "running"
        try:
            async with asyncio.timeout(self.settings.server_tool_timeout_s):
                output = await run.tools.run_server_tool(name, arguments)
            outcome = ToolOutcome("ok", output=output)
        except TimeoutError:
            outcome = ToolOutcome("error", error={
                "message": f"{name} took longer than {self.settings.server_tool_timeout_s:g} s",
                "code": "server_tool_timeout"})
        except Exception as exc:
            logger.warning("server tool %s failed: %r", name, exc,
                           extra={"run_id": run.run_id, "document_id": run.document_id})
            outcome = ToolOutcome("error", error={"message": f"{name} failed: {exc}"[:500]})
        await self.coordinator.emit(run, ToolDone(
            run_id=run.run_id, call_id=call_id, status=outcome.status,
            output=outcome.output, error=outcome.error))
        return outcome
