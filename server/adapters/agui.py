"""`POST /v1/agui/{document_id}`: AG-UI (`RunAgentInput` in, AG-UI events out as SSE).

Mapping (PROTOCOL.md section 16), with ag-ui-protocol's pydantic models: `threadId`
names the chat and the cowrite thread (when it is a valid thread id, else the default
thread), `runId` becomes the cowrite `run_id` of a new run, the last user message is the
prompt, `tools` are the client tools, `context` and `state` go to `context.extra`
(`agui_context`, `agui_state`). Events: `RUN_STARTED` (with the request's ids) opens
every response; `TEXT_MESSAGE_*`, `TOOL_CALL_START/ARGS/END`, `TOOL_CALL_RESULT` (server
tools); a client tool call ends the response with `RUN_FINISHED` (`outcome: success`,
`pendingToolCallIds`); the next input whose messages hold a `tool` message for that
`toolCallId` delivers it and streams the rest of the same run. An approval ends the
response with `RUN_FINISHED` `outcome: interrupt` (one interrupt, id = tool call id,
reason `tool_approval`); the next input's `resume` entry answers it (`resolved` with
`payload.approved`, or `cancelled` = reject). The run's end: `RUN_FINISHED` (a cancelled
or aborted run: `outcome: cancelled`, the cowrite status and reason in
`metadata.cowrite`), or `RUN_ERROR` (`code` = status, e.g. `timed_out:tool_timeout`). A
response whose link the server closed (a drain, the document log reset) ends with
`RUN_ERROR` (`code` `connection_lost`) while the run goes on. An input sent again whose
answer the run applied (its first request failed) streams the rest again, once, if it
never reached the frontend (delivery.py), with that input's ids. A run that moves to
another instance mid-text ends the discarded message (`TEXT_MESSAGE_END`), takes it
back with a `MESSAGES_SNAPSHOT` of the frontend's messages without it (agui_mirror),
and streams the answer again as a new message.
"""

from collections.abc import AsyncIterator
from typing import Any

import orjson
from ag_ui.core import (
    BaseEvent,
    Message,
    RunAgentInput,
    RunFinishedEvent,
    RunStartedEvent,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from protocol.client import RunContext, RunStart, ToolSpec
from protocol.codes import ErrorCode
from protocol.jsonlimits import nesting_over
from protocol.server import (
    Error,
)
from server.adapters.agui_events import AguiTranslator
from server.adapters.agui_mirror import MessageMirror
from server.adapters.ai_sdk import thread_for
from server.adapters.chat import ChatRun, ChatRuns
from server.adapters.chat_run import Kind
from server.adapters.http import (
    HttpFailure,
    bearer_token,
    check_document,
    principal_for,
    read_object,
)
from server.backends.base import BackendUnavailable
from server.services import Services

KIND = "agui"
THREAD_ID_MAX = 100
"""`threadId`'s longest (any characters): `agui:<threadId>` is the run's client id, at
most 128 characters; 100 like the AI SDK's chat id."""


def _parse(data: dict[str, Any]) -> RunAgentInput:
    try:
        parsed = RunAgentInput.model_validate(data)
    except ValidationError as exc:
        details = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()[:10]]
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, "invalid RunAgentInput",
                          details=details) from exc
    if not 0 < len(parsed.thread_id) <= THREAD_ID_MAX:
        problem = f"threadId must be 1 to {THREAD_ID_MAX} characters"
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, problem,
                          details=[{"loc": ["threadId"], "msg": problem}])
    return parsed


def _approved(entry: Any, index: int) -> bool:
    """Whether a `resume` entry approves (`resolved` with `payload.approved`, default
    true); a 400 when its payload is neither absent nor an object with a boolean."""
    payload = {} if entry.payload is None else entry.payload
    approved = payload.get("approved", True) if isinstance(payload, dict) else None
    if not isinstance(approved, bool):  # `false`, "reject", 0 must not approve
        problem = "a resume payload is an object whose `approved` is true or false"
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, problem, details=[
            {"loc": ["resume", index, "payload"], "msg": problem}])
    return entry.status == "resolved" and approved


def _tool_outcome(message: Any) -> tuple[str, Any]:
    """A `tool` message as ("error", its message) or ("ok", its output: JSON text parsed)."""
    error = getattr(message, "error", None)
    if error:
        return "error", str(error)
    content = message.content
    if not isinstance(content, str):
        return "ok", [part.model_dump(mode="json", by_alias=True) for part in content]
    try:
        return "ok", orjson.loads(content)  # a tool returning JSON sends it as text
    except orjson.JSONDecodeError:
        return "ok", content


def _check_tool_contents(data: RunAgentInput, max_depth: int) -> None:
    """A `tool` message's text is parsed as JSON (`_tool_outcome`): it is held to the
    depth limit of every frame, as the body around it is (nested 253 levels deep, it
    reached the run and the log, which every other edge refuses)."""
    for message in data.messages:
        content = getattr(message, "content", None)
        if message.role == "tool" and isinstance(content, str) \
                and nesting_over(content, max_depth):
            raise HttpFailure(ErrorCode.INVALID_MESSAGE, f"a tool message's content nests "
                              f"objects and arrays deeper than {max_depth} levels")


def _answer(run: ChatRun[BaseEvent], data: RunAgentInput) -> Any:
    """The tool result or approval this input carries for the run's pending call."""
    for index, entry in enumerate(data.resume or []):
        if entry.interrupt_id in run.pending:
            payload = entry.payload if isinstance(entry.payload, dict) else {}
            reason = payload.get("reason")
            return run.approval(entry.interrupt_id, _approved(entry, index),
                                reason if isinstance(reason, str) else None)
    for message in data.messages:
        call_id = getattr(message, "tool_call_id", None)
        if message.role == "tool" and call_id in run.pending:
            status, value = _tool_outcome(message)
            if status == "error":
                return run.tool_result(call_id, error={"message": value})
            return run.tool_result(call_id, output=value)
    return None


def _applied(run: ChatRun[BaseEvent], data: RunAgentInput) -> tuple[Kind, str, int] | None:
    """The call whose answer this input repeats, when it is the run's latest answered
    call and the run applied this very answer (`ChatRun.applied`), with the segment
    that followed it."""
    resumed = {entry.interrupt_id: (index, entry) for index, entry in
               enumerate(data.resume or [])}
    results = {m.tool_call_id: m for m in data.messages
               if m.role == "tool" and isinstance(getattr(m, "tool_call_id", None), str)}
    keys: list[tuple[Kind, str]] = [("approval", call_id) for call_id in resumed]
    keys += [("tool", call_id) for call_id in results]
    latest = run.latest_answered(keys)
    if latest is None:
        return None
    kind, call_id = latest
    if kind == "approval":
        index, entry = resumed[call_id]
        segment = run.applied(kind, call_id, "approve" if _approved(entry, index) else "reject")
    else:
        status, value = _tool_outcome(results[call_id])
        segment = run.applied(kind, call_id, status, output=value) if status == "ok" \
            else run.applied(kind, call_id, status, error_message=value)
    return None if segment is None else (kind, call_id, segment)


def _answers_something(data: RunAgentInput) -> bool:
    """The input could answer a pending call (a resume entry or a tool message): worth
    looking for the thread's run on another instance (`ChatRuns.find`)."""
    return bool(data.resume) or any(message.role == "tool" for message in data.messages)


def _is_answer(data: RunAgentInput) -> bool:
    """The input is an answer, not a prompt: it resumes an interrupt, or its last message
    is a tool result (what `HttpAgent` sends after a frontend tool ran). Answering
    nothing pending, it is refused, never run again as the last user message's prompt
    (a retry, a double submit or a result after the call timed out would redo the run)."""
    return bool(data.resume) or (bool(data.messages) and data.messages[-1].role == "tool")


def _prompt(data: RunAgentInput) -> str:
    for message in reversed(data.messages):
        if message.role == "user":
            content = message.content
            if isinstance(content, str):
                return content
            return "".join(getattr(part, "text", "") or "" for part in content)
    return ""


async def _open(services: Services, runs: ChatRuns, document_id: str, request: Request,
                data: RunAgentInput) -> tuple[ChatRun[BaseEvent], int, bool]:
    """The run and where to stream it from; True when what is streamed was made for an
    earlier request (an answer the run applied, sent again: `_ids_of`)."""
    principal = principal_for(services, bearer_token(request), document_id)
    _check_tool_contents(data, services.settings.max_json_depth)
    answering = _is_answer(data)
    existing = runs.get(KIND, document_id, data.thread_id, principal.user_id)
    translator_for = lambda _run_id: AguiTranslator(data.thread_id, data.run_id)  # noqa: E731
    if existing is None and _answers_something(data):
        found = await runs.find(KIND, document_id, data.thread_id, principal, translator_for)
        if isinstance(found, Error) and answering:  # another user's run: 403
            raise HttpFailure.of(found)
        # A prompt whose history holds tool messages goes on as that user's prompt.
        existing = None if isinstance(found, Error) else found
    message = _answer(existing, data) if existing is not None else None
    if existing is not None and message is None and not existing.finished and \
            _answers_something(data):  # its call may have been asked elsewhere just now
        await existing.link.catch_up()
        message = _answer(existing, data)
    if existing is not None and message is not None:
        if principal.user_id != existing.link.conn.user_id:
            raise HttpFailure(ErrorCode.FORBIDDEN, "only the run's user may answer it")
        translator = existing.translator
        assert isinstance(translator, AguiTranslator)
        previous, translator.ids = translator.ids, (data.thread_id, data.run_id)
        answer = await existing.answer(message)
        if not isinstance(answer, Error) and not answer.duplicate:
            return existing, existing.segment_start, False
        translator.ids = previous
        if isinstance(answer, Error) and answer.code != ErrorCode.CALL_NOT_PENDING:
            raise HttpFailure.of(answer)
    if answering:  # nothing pending: an answer the run applied, sent again?
        again = await runs.redelivery(KIND, document_id, data.thread_id, principal,
                                      translator_for, existing, lambda run: _applied(run, data))
        if again is None:
            raise HttpFailure(ErrorCode.CALL_NOT_PENDING, "this input answers no pending tool "
                              "call or approval of this thread (a new prompt ends with the "
                              "user's message and has no resume entries)")
        if not again[0].finished:  # what follows is this request's
            translator = again[0].translator
            assert isinstance(translator, AguiTranslator)
            translator.ids = (data.thread_id, data.run_id)
        return again[0], again[1], True
    prompt = _prompt(data)
    if not prompt:
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, "no user message to run, and no answer to "
                          "a pending tool call or approval of this thread")
    extra: dict[str, Any] = {}
    if data.context:
        extra["agui_context"] = [c.model_dump(mode="json") for c in data.context]
    if data.state is not None:
        extra["agui_state"] = data.state
    try:
        tools = [ToolSpec(name=t.name, description=t.description,
                          **({"parameters": t.parameters} if t.parameters else {}))
                 for t in data.tools or []]
        start = RunStart(type="run.start", run_id=data.run_id, prompt=prompt, tools=tools,
                         context=RunContext(extra=extra) if extra else None,
                         thread_id=thread_for(data.thread_id))
    except ValidationError as exc:
        details = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()[:10]]
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, "invalid run from RunAgentInput",
                          details=details) from exc
    run = await runs.start(KIND, document_id, data.thread_id, principal, start,
                           AguiTranslator(data.thread_id, data.run_id))
    if isinstance(run, Error):
        raise HttpFailure.of(run)
    return run, 0, False


async def _ids_of(events: AsyncIterator[BaseEvent], ids: tuple[str, str]
                  ) -> AsyncIterator[BaseEvent]:
    """`events` with the request's (threadId, runId) in `RUN_STARTED` / `RUN_FINISHED`:
    each response carries its own request's ids, also when it streams again a segment
    made for an earlier request."""
    async for event in events:
        if isinstance(event, (RunStartedEvent, RunFinishedEvent)):
            event = event.model_copy(update={"thread_id": ids[0], "run_id": ids[1]})
        yield event


async def _sse(events: AsyncIterator[BaseEvent], messages: list[Message]
               ) -> AsyncIterator[str]:
    """The response's events, a discarded message's marker made into the snapshot of
    this frontend's messages without it (agui_mirror)."""
    encoder = EventEncoder()
    mirror = MessageMirror(messages)
    async for event in events:
        sent = mirror.apply(event)
        if sent is not None:
            yield encoder.encode(sent)


async def post_agui(request: Request) -> Response:
    services: Services = request.app.state.services
    document_id: str = request.path_params["document_id"]
    try:
        check_document(document_id)
        # The caller first: the body was read (up to the size limit, without a deadline)
        # before the token was looked at, so anyone could hold memory and sockets.
        principal_for(services, bearer_token(request), document_id)
        data = _parse(await read_object(request, services))
        run, start, again = await _open(services, request.app.state.chat_runs, document_id,
                                        request, data)
    except HttpFailure as failure:
        return failure.response()
    except BackendUnavailable:
        return HttpFailure(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry "
                           "shortly", retry_after_ms=1000).response()
    events = run.follow(start)
    if again:
        events = _ids_of(events, (data.thread_id, data.run_id))
    return StreamingResponse(_sse(events, data.messages), media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
