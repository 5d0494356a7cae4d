"""A client's `tool.result`, `approval` or `run.cancel` as the run machine's input."""

from protocol.client import Approval, RunCancel, ToolResult
from server.agent.driver import RunDriver
from server.agent.run_state import ToolOutcome
from server.agent.steps import ApprovalAnswer, Cancel, ClientToolResult, Input
from server.agent.work import now_ms
from server.connection import Peer


def client_input(driver: RunDriver | None, peer: Peer,
                 message: ToolResult | Approval | RunCancel) -> Input:
    """A client's answer or cancel as the run machine's input (an approval's edited
    arguments checked against the tool's schema first)."""
    if isinstance(message, ToolResult):
        outcome = (ToolOutcome("error", error=message.error.to_wire())
                   if message.error is not None else ToolOutcome("ok", output=message.output))
        return ClientToolResult(message.call_id, message.token, outcome, peer.user_id,
                                now_ms(), message.id, message.document_version)
    if isinstance(message, Approval):
        arguments, problem = message.arguments, None
        current = driver.state.current if driver is not None else None
        if message.decision == "approve" and arguments is not None and current is not None \
                and driver is not None:
            checked = driver.toolbox.check(current.name, arguments)
            if isinstance(checked, str):
                arguments, problem = None, checked
            else:
                arguments = checked.arguments
        return ApprovalAnswer(message.call_id, peer.user_id, message.decision, message.scope,
                              arguments, problem, message.reason, now_ms(), message.id)
    return Cancel(peer.user_id, message.id)
