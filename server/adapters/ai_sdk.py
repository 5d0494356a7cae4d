"""The Vercel AI SDK (5 to 7) endpoints (PROTOCOL.md section 16).

- `POST /v1/ai-sdk/{document_id}/chat`: `DefaultChatTransport` / `useChat`.
  Answers one segment of the run's UI message stream as SSE
  (`x-vercel-ai-ui-message-stream: v1`, ending `data: [DONE]`).
- `GET /v1/ai-sdk/{document_id}/chat/{chat_id}/stream`: `reconnectToStream`;
  replays the active run's stream from its start and follows it; else the
  chat's last run, once, when it ended within `delivery.WINDOW_S` and its end
  never reached the frontend; 204 otherwise.
- `GET /v1/ai-sdk/{document_id}/ws`: `WebSocketChatTransport` frames.

A request whose last message is the user's starts a run (its text parts are
the prompt; earlier messages are not sent to the model: cowrite keeps the
document's own history). A request whose last message is the assistant's
answers the chat's pending client tool call (a tool part in
`output-available` / `output-error`) or approval (`approval-responded`) and
streams the rest of the same run; sent again after the run applied it (its
first request failed), it streams that rest once more if it never reached the
frontend (delivery.py). The chunk mapping is in `ai_sdk_chunks`; its
`reset-step` (a handed-over run's interrupted text taken back) reaches an SSE
frontend only when it says it runs `ai` 7 (`RESETS_HEADER`).
"""

import re
from collections.abc import AsyncIterator
from typing import Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from protocol.base import DEFAULT_THREAD, THREAD_ID_PATTERN
from protocol.client import RunContext, RunOptions, RunStart, ToolSpec
from protocol.codes import ErrorCode
from protocol.server import Error
from server.adapters.ai_sdk_chunks import (
    AiSdkTranslator,
    Chunk,
    answered_calls,
    asks_again,
    discarded_text,
    without_resets,
)
from server.adapters.chat import ChatRun, ChatRuns
from server.adapters.chat_run import Kind
from server.adapters.http import (
    HttpFailure,
    bearer_token,
    check_document,
    principal_for,
    read_object,
)
from server.adapters.link import new_message_id
from server.auth import Principal
from server.backends.base import BackendUnavailable
from server.services import Services

KIND = "ai-sdk"
CHAT_ID = r"^[A-Za-z0-9._:-]{1,100}$"
STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1", "cache-control": "no-cache",
                  "x-accel-buffering": "no"}


def thread_for(chat_id: str) -> str:
    """A chat's thread: its id when that is a valid thread id, else the default one."""
    return chat_id if re.fullmatch(THREAD_ID_PATTERN, chat_id) else DEFAULT_THREAD


class ChatRequest(BaseModel):
    """`DefaultChatTransport`'s body plus cowrite's fields; other fields are ignored
    (frontends add their own)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str = Field(pattern=CHAT_ID)
    messages: list[dict[str, Any]] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    tools: list[ToolSpec] = Field(default_factory=list, max_length=128)
    context: RunContext | None = None
    mode: Literal["agent", "chat"] = "agent"
    options: RunOptions | None = None
    thread_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    """The conversation thread (default: the chat `id`, when it is a valid thread id)."""


def parse_request(data: dict[str, Any]) -> ChatRequest:
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        details = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()[:10]]
        where = ", ".join(".".join(str(p) for p in d["loc"]) or "(body)" for d in details[:3])
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, f"invalid chat request at {where}",
                          details=details) from exc


def _text(message: dict[str, Any]) -> str:
    parts = message.get("parts")
    if isinstance(parts, list):
        return "".join(p["text"] for p in parts if isinstance(p, dict)
                       and p.get("type") == "text" and isinstance(p.get("text"), str))
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _answer_in(run: ChatRun[Chunk], message: dict[str, Any]) -> Any:
    """The `tool.result` or `approval` the assistant message carries for a pending call."""
    parts = message.get("parts")
    for part in parts if isinstance(parts, list) else ():
        call_id = part.get("toolCallId") if isinstance(part, dict) else None
        if not isinstance(call_id, str) or call_id not in run.pending:
            continue
        state = part.get("state")
        if state == "output-available":
            return run.tool_result(call_id, output=part.get("output"))
        if state == "output-error":
            return run.tool_result(call_id, error={"message": str(part.get("errorText", ""))})
        approval = part.get("approval")
        if state == "approval-responded" and isinstance(approval, dict):
            approved, reason = approval.get("approved"), approval.get("reason")
            if not isinstance(approved, bool):  # "false" must not approve
                raise HttpFailure(ErrorCode.INVALID_MESSAGE,
                                  "approval.approved must be true or false",
                                  details=[{"loc": ["approval", "approved"],
                                            "msg": "must be a boolean"}])
            return run.approval(call_id, approved, reason if isinstance(reason, str) else None)
    return None


def _applied_in(run: ChatRun[Chunk], message: dict[str, Any]) -> tuple[Kind, str, int] | None:
    """The call whose answer the assistant message repeats, when it is the run's latest
    answered call and the run applied this very answer (`ChatRun.applied`), with the
    segment that followed it: the call, and where to stream from."""
    parts = message.get("parts")
    by_call = {p["toolCallId"]: p for p in (parts if isinstance(parts, list) else ())
               if isinstance(p, dict) and isinstance(p.get("toolCallId"), str)}
    latest = run.latest_answered((kind, call_id) for call_id in by_call
                                 for kind in ("tool", "approval"))
    if latest is None:
        return None
    kind, call_id = latest
    part = by_call[call_id]
    state, approval = part.get("state"), part.get("approval")
    segment: int | None = None
    if kind == "tool" and state == "output-available":
        segment = run.applied(kind, call_id, "ok", output=part.get("output"))
    elif kind == "tool" and state == "output-error":
        segment = run.applied(kind, call_id, "error",
                              error_message=str(part.get("errorText", "")))
    elif kind == "approval" and state == "approval-responded" and isinstance(approval, dict) \
            and isinstance(approval.get("approved"), bool):
        segment = run.applied(kind, call_id, "approve" if approval["approved"] else "reject")
    return None if segment is None else (kind, call_id, segment)


class Segment(NamedTuple):
    """What a request streams: `run`'s items from `start`, live, or as a replay (no
    answered call asked again, no discarded text: `replayed`); with `reset-step`
    chunks only for a frontend that accepts them (`resets`: `ai` 7)."""

    run: ChatRun[Chunk]
    start: int
    replay: bool = False
    resets: bool = False

    def chunks(self) -> AsyncIterator[Chunk]:
        chunks = replayed(self.run, self.start) if self.replay else self.run.follow(self.start)
        return chunks if self.resets else without_resets(chunks)

    def with_resets(self, resets: bool) -> "Segment":
        return self._replace(resets=resets)


RESETS_HEADER = "x-cowrite-ai-sdk"
"""The major version of `ai` a `DefaultChatTransport` frontend runs (its `headers`, so
both the chat request and the reconnect carry it): 7 or later accepts `reset-step`,
which takes back the text of a model call made again after the run moved to another
instance (ai_sdk_chunks). Without it, `ai` 5 or 6 is assumed: they fail the chat on a
chunk type they do not know. The WebSocket transport exists from `ai` 7 only."""


def accepts_resets(request: Request) -> bool:
    """`7`, `7.0.173`, `v7`: the major version counts."""
    major = re.match(r"v?(\d{1,6})(?!\d)", request.headers.get(RESETS_HEADER, "").strip())
    return major is not None and int(major.group(1)) >= 7


async def open_segment(services: Services, runs: ChatRuns, document_id: str,
                       principal: Principal, request: ChatRequest) -> Segment:
    """Start the chat's run or deliver the frontend's answer: what to stream. An answer
    the run already applied whose segment never reached the frontend (its request
    was answered `unavailable`, its stream broke off) streams that segment again."""
    last = request.messages[-1]
    if last.get("role") == "assistant":
        existing = await runs.find(KIND, document_id, request.id, principal, AiSdkTranslator)
        if isinstance(existing, Error):
            raise HttpFailure.of(existing)
        message = _answer_in(existing, last) if existing is not None else None
        if existing is not None and message is None and not existing.finished:
            await existing.link.catch_up()  # the call may have been asked elsewhere just now
            message = _answer_in(existing, last)
        if existing is not None and message is not None:
            if principal.user_id != existing.link.conn.user_id:
                raise HttpFailure(ErrorCode.FORBIDDEN, "only the run's user may answer it")
            answer = await existing.answer(message)
            if isinstance(answer, Error) and answer.code != ErrorCode.CALL_NOT_PENDING:
                raise HttpFailure.of(answer)
            if not isinstance(answer, Error) and not answer.duplicate:
                return Segment(existing, existing.segment_start)
        # Nothing pending (or a repeat): an answer the run applied, sent again?
        again = await runs.redelivery(KIND, document_id, request.id, principal,
                                      AiSdkTranslator, existing,
                                      lambda run: _applied_in(run, last))
        if again is not None:
            return Segment(again[0], again[1], replay=True)
        raise HttpFailure(ErrorCode.CALL_NOT_PENDING, "the last message answers no pending "
                          "tool call or approval of this chat")
    prompt = _text(last)
    if last.get("role") != "user" or not prompt:
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, "the last message must be the user's text "
                          "or answer a pending tool call")
    run_id = f"run_{new_message_id()}"
    start = RunStart(type="run.start", run_id=run_id, mode=request.mode, prompt=prompt,
                     context=request.context, tools=request.tools, options=request.options,
                     thread_id=request.thread_id or thread_for(request.id))
    run = await runs.start(KIND, document_id, request.id, principal, start,
                           AiSdkTranslator(run_id))
    if isinstance(run, Error):
        raise HttpFailure.of(run)
    return Segment(run, 0)


async def _sse(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _stream(segment: Segment) -> Response:
    return StreamingResponse(_sse(segment.chunks()), media_type="text/event-stream",
                             headers=STREAM_HEADERS)


async def replayed(run: ChatRun[Chunk], start: int = 0) -> AsyncIterator[Chunk]:
    """A resume: the run from its start (or `start`), then live, without asking for
    answered calls again (`asks_again`) nor the text of messages whose model call was
    made again (`discarded_text`: the run moved to another instance), which showed it
    twice."""
    answered = answered_calls(run.items)
    translator = run.translator
    discarded = translator.discarded if isinstance(translator, AiSdkTranslator) else set()
    dropping: set[str] = set()
    async for chunk in run.follow(start):
        if not asks_again(chunk, answered) and not discarded_text(chunk, discarded, dropping):
            yield chunk


async def post_chat(request: Request) -> Response:
    services: Services = request.app.state.services
    runs: ChatRuns = request.app.state.chat_runs
    document_id: str = request.path_params["document_id"]
    try:
        check_document(document_id)
        principal = principal_for(services, bearer_token(request), document_id)
        chat = parse_request(await read_object(request, services))
        segment = await open_segment(services, runs, document_id, principal, chat)
    except HttpFailure as failure:
        return failure.response()
    except BackendUnavailable:
        return HttpFailure(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry "
                           "shortly", retry_after_ms=1000).response()
    return _stream(segment.with_resets(accepts_resets(request)))


async def get_chat_stream(request: Request) -> Response:
    services: Services = request.app.state.services
    runs: ChatRuns = request.app.state.chat_runs
    document_id: str = request.path_params["document_id"]
    chat_id: str = request.path_params["chat_id"]
    try:
        check_document(document_id)
        principal = principal_for(services, bearer_token(request), document_id, write=False)
    except HttpFailure as failure:
        return failure.response()
    if not re.fullmatch(CHAT_ID, chat_id):
        return Response(status_code=204)
    try:
        run = await reconnected(runs, document_id, chat_id, principal)
    except BackendUnavailable:
        return HttpFailure(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry "
                           "shortly", retry_after_ms=1000).response()
    if run is None:
        return Response(status_code=204)
    return _stream(Segment(run, 0, replay=True, resets=accepts_resets(request)))


async def reconnected(runs: ChatRuns, document_id: str, chat_id: str, principal: Principal
                      ) -> ChatRun[Chunk] | None:
    """What a reconnect replays: the chat's active run, else its last run when that
    ended within `delivery.WINDOW_S` and no request streamed its end (delivery.py:
    the frontend was away, or its stream broke off, when the run ended)."""
    run = await runs.followable(KIND, document_id, chat_id, principal, AiSdkTranslator)
    if run is None:
        run = await runs.undelivered_end(KIND, document_id, chat_id, principal,
                                         AiSdkTranslator)
    return run
