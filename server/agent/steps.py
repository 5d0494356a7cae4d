"""What goes into the run machine (inputs) and what comes out (effects).

Inputs are facts: the model finished a turn, a client sent a result, a timer
fired. Effects are requests to the driver: log these events, answer the
sender, call the model, run a server tool, arm a timer, share the record,
free the document. Both are plain frozen values, so the machine can be
driven by a test exactly as by the driver, with no event loop.
"""

import hmac
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from protocol.codes import ErrorCode
from protocol.server import Ack, DurableServerEvent, Error, FinishedStatus, RunError
from server.agent.run_state import ModelCall, PendingCall, RunState, ToolOutcome
from server.agent.wire_events import LoggedEventSource, Message
from server.auth import CallGrant
from server.records import quick_init


# -- inputs -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Begin:
    """The run was admitted and holds the document: announce it, call the model."""

    at_ms: int
    reply_to: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class ModelFinished:
    """A model turn ended. `text` is what the user saw (streamed unless json_tools)."""

    text: str
    calls: tuple[ModelCall, ...] = ()
    usage: tuple[tuple[str, int], ...] = ()
    assistant_content: str | None = None  # json_tools: the raw answer the model wrote
    terminate: bool = False  # json_tools: the model said it is done after its call
    at_ms: int = 0


@dataclass(frozen=True, slots=True)
class ModelUnparseable:
    """json_tools: the model's answer was not the JSON asked for."""

    text: str
    problem: str
    usage: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ModelFailed:
    error: RunError


@quick_init
@dataclass(frozen=True, slots=True)
class ClientToolResult:
    call_id: str
    token: str
    outcome: ToolOutcome
    user_id: str
    at_ms: int
    reply_to: str | None = None
    document_version: int | str | None = None  # the editor's, after the tool ran


@dataclass(frozen=True, slots=True)
class ServerToolFinished:
    call_id: str
    outcome: ToolOutcome
    at_ms: int  # when it finished: the next call's deadline counts from here


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    call_id: str
    user_id: str
    decision: Literal["approve", "reject"]
    scope: Literal["call", "run"] = "call"
    arguments: dict[str, Any] | None = None  # edited arguments, already validated
    problem: str | None = None  # why the edited arguments are invalid
    reason: str | None = None
    at_ms: int = 0
    reply_to: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    user_id: str
    reply_to: str | None = None


@dataclass(frozen=True, slots=True)
class End:
    """An ending decided outside the run: user edit, supersede, shutdown, owner lost."""

    status: FinishedStatus
    reason: str


@dataclass(frozen=True, slots=True)
class DocumentEdited:
    """An `editor.change`: a user's edit may end the run (section 11); any edit
    updates the document version the run knows."""

    user_id: str
    origin: Literal["user", "agent"]
    version: int | str | None = None
    summary: str | None = None
    changes: tuple[tuple[int, int, int], ...] | None = None
    key: str | None = None  # the message's sender and `id` (`edit_key`): a resend's is seen


@dataclass(frozen=True, slots=True)
class Resume:
    """This instance took the run over from its checkpoint (section 13)."""

    reason: Literal["owner_lost", "handoff"]
    at_ms: int
    text_sent: bool = False  # the interrupted model call had streamed text
    idempotent: bool = False  # the interrupted server tool may run again


@dataclass(frozen=True, slots=True)
class TimerFired:
    key: str  # "run", "grace", "call:<call_id>" or "approval:<call_id>"


@dataclass(frozen=True, slots=True)
class ExecutorPresence:
    present: bool


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """Another instance ended this run (its lease lapsed): stop without a word."""


@dataclass(frozen=True, slots=True)
class Crashed:
    """Something failed that the run cannot recover from (a bug, an unloggable event)."""

    ref: str


Input = (Begin | ModelFinished | ModelUnparseable | ModelFailed | ClientToolResult
         | ServerToolFinished | ApprovalAnswer | Cancel | End | DocumentEdited | TimerFired
         | ExecutorPresence | LeaseLost | Crashed | Resume)


# -- effects ----------------------------------------------------------------------
@quick_init
@dataclass(frozen=True, slots=True)
class Publish:
    """Log these durable events, in order."""

    events: tuple[LoggedEventSource, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the sender of the input (an `ack` or an `error`)."""

    message: Message


@quick_init
@dataclass(frozen=True, slots=True)
class Remember:
    """Append conversation history entries."""

    entries: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class RememberPartial:
    """Keep the text the current message streamed so far, marked interrupted."""

    interrupted_by: str


@dataclass(frozen=True, slots=True)
class CallModel:
    pass


@dataclass(frozen=True, slots=True)
class RunServerTool:
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StopWork:
    """Cancel the model call and any server tool in flight."""


@quick_init
@dataclass(frozen=True, slots=True)
class ArmTimer:
    key: str
    delay_s: float


@quick_init
@dataclass(frozen=True, slots=True)
class DisarmTimer:
    key: str  # "*" disarms every timer


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Share the run's state (pending calls, status) with other instances."""


@dataclass(frozen=True, slots=True)
class Release:
    """The run is over and its end is logged: free the document."""

    status: FinishedStatus


# The effects without a variable part, made once: a round trip asks for four checkpoints,
# a model call and a grace timer's end, and each frozen dataclass costs as much to make
# as a small dict (values compare equal, so nothing can tell them from new ones).
CHECKPOINT = Checkpoint()
CALL_MODEL = CallModel()
STOP_WORK = StopWork()
DISARM_GRACE = DisarmTimer("grace")
DISARM_ALL = DisarmTimer("*")

Effect = (Publish | Reply | Remember | RememberPartial | CallModel | RunServerTool | StopWork
          | ArmTimer | DisarmTimer | Checkpoint | Release)


@quick_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The new state and what to do. The state is committed only once the decision's
    one `Publish` is logged; if it cannot be, nothing changed: a `refusable` input's
    sender gets an error (and may retry), any other input ends the run from the state
    it had before."""

    state: RunState
    effects: tuple[Effect, ...] = ()
    refusable: bool = False
    reply_to: str | None = None


# -- what the machine is configured with, and how it collects effects ----------
class Signer(Protocol):
    """Per-call tokens: pure functions of a key (server.auth.Authenticator)."""

    def issue_call_token(self, grant: CallGrant) -> str: ...

    def check_call_token(self, token: str, expected: CallGrant, now_ms: int) -> str | None: ...


@dataclass(frozen=True)
class MachineConfig:
    signer: Signer
    tool_timeout_s: float
    approval_timeout_s: float
    run_timeout_s: float
    client_grace_s: float
    checkpoint_steps: bool = True  # a checkpoint per model step (durable runs)


class EffectList:
    """Effects of one transition. All its events form ONE `Publish`, placed where the
    first was published: logging that group is the transition's commit point, so
    effects before it must be harmless if it fails (a checkpoint, the preparations
    of an ending), and everything that depends on the announcement comes after."""

    __slots__ = ("_checkpoint", "_effects", "_events", "_slot")

    def __init__(self) -> None:
        self._effects: list[Effect | None] = []
        self._events: list[DurableServerEvent] = []
        self._slot: int | None = None
        self._checkpoint = False

    def publish(self, *events: DurableServerEvent) -> None:
        if self._slot is None:
            self._slot = len(self._effects)
            self._effects.append(None)
        self._events.extend(events)

    def do(self, *effects: Effect) -> None:
        for effect in effects:
            if isinstance(effect, Checkpoint):
                self._checkpoint = True  # written once, before the group it describes
            else:
                self._effects.append(effect)

    @property
    def effects(self) -> tuple[Effect, ...]:
        group = Publish(tuple(self._events))
        out: list[Effect] = []
        for effect in self._effects:
            if effect is None:
                if self._checkpoint:
                    out.append(CHECKPOINT)
                out.append(group)
            else:
                out.append(effect)
        if self._checkpoint and self._slot is None:
            out.append(CHECKPOINT)
        return tuple(out)


def refuse(code: ErrorCode, message: str, reply_to: str | None, run_id: str,
           details: Any = None) -> Reply:
    return Reply(Error(code=code, message=message, reply_to=reply_to, run_id=run_id,
                       details=details))


def call_token_problem(signer: Signer, state: RunState, current: PendingCall,
                       event: ClientToolResult) -> str | None:
    """`signer.check_call_token` of a result for the pending client call `current`.

    `current.token` is the token the run issued for this call: for the run's own
    run and document, `current.call_id`, the run's user and `current.expires_at`
    (`RunMachine._dispatch`; checkpoints and records keep it with them). A token
    byte-equal to it, sent by that user before that deadline, is the case where the
    full check answers None, at the cost of one comparison instead of two base64
    decodes, a JSON parse and a MAC. Anything else takes the full check, so a forged,
    stale or other user's token gets exactly its answer (tests/test_hot_paths_machine)."""
    token = current.token
    if token is not None and event.user_id == state.user_id \
            and event.at_ms <= current.expires_at and event.token.isascii() \
            and hmac.compare_digest(event.token, token):
        return None
    return signer.check_call_token(
        event.token, state.grant(current.call_id, event.user_id, 0), event.at_ms)


def repeat_reply(state: RunState, event: ClientToolResult, signer: Signer) -> Reply:
    """A result for a call the active run is not waiting on: a repeat of an accepted one
    (valid token) is acked `duplicate` (a safe retry changes nothing); anything else is
    `call_not_pending`. (Once the run is over, every result gets `run_not_active`.)"""
    if event.call_id in state.completed_calls:
        grant = state.grant(event.call_id, event.user_id, 0)
        problem = signer.check_call_token(event.token, grant, 0)
        if problem is None:
            return Reply(Ack(reply_to=event.reply_to, run_id=state.run_id,
                             call_id=event.call_id, duplicate=True))
        return refuse(ErrorCode.INVALID_TOKEN, problem, event.reply_to, state.run_id)
    return refuse(ErrorCode.CALL_NOT_PENDING, f"call {event.call_id!r} is not pending",
                  event.reply_to, state.run_id)


def after_end(state: RunState, event: Input) -> Decision:
    """Nothing leaves `finished`; messages about the run learn that it is over."""
    if not isinstance(event, (ClientToolResult, ApprovalAnswer, Cancel)):
        return Decision(state)
    over = f"run {state.run_id!r} has finished"
    return Decision(state, (refuse(ErrorCode.RUN_NOT_ACTIVE, over, event.reply_to,
                                   state.run_id),), reply_to=event.reply_to)
