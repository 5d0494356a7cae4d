"""`POST /v1/documents/{id}/runs/{run_id}/tool-results`: `tool.result` without a WebSocket.

The body becomes the very `ToolResult` a WebSocket client would send and is
handed to the document session through a short-lived `RunLink`; the ack or
error the engine answers becomes the HTTP answer (PROTOCOL.md section 16).
"""

import uuid

from starlette.requests import Request
from starlette.responses import Response

from protocol.client import ToolResult
from protocol.codes import ErrorCode
from protocol.parsing import ParseFailure, validate_message
from protocol.server import Error
from server.adapters.delivery import applied_result
from server.adapters.http import (
    HttpFailure,
    bearer_token,
    check_document,
    json_response,
    principal_for,
    read_object,
)
from server.adapters.link import RunLink
from server.backends.base import BackendUnavailable
from server.limits import UserBuckets
from server.services import Services

BODY_FIELDS = frozenset({"call_id", "token", "output", "error", "document_version"})
CLIENT_ID = "http-tool-results"


async def post_tool_result(request: Request) -> Response:
    services: Services = request.app.state.services
    document_id: str = request.path_params["document_id"]
    run_id: str = request.path_params["run_id"]
    try:
        check_document(document_id)
        principal = principal_for(services, bearer_token(request), document_id)
        buckets: UserBuckets = request.app.state.tool_result_buckets
        wait_ms = buckets.take(principal.user_id)
        if wait_ms:
            raise HttpFailure(ErrorCode.RATE_LIMITED, "too many tool results; wait before the "
                              "next", retry_after_ms=wait_ms)
        body = await read_object(request, services)
        unknown = sorted(set(body) - BODY_FIELDS)
        if unknown:
            raise HttpFailure(ErrorCode.INVALID_MESSAGE, f"unknown field {unknown[0][:64]!r}",
                              details=[{"loc": [unknown[0][:64]], "msg": "not allowed"}])
        message = validate_message({**body, "type": "tool.result", "run_id": run_id,
                                    "id": uuid.uuid4().hex[:16]})
        if isinstance(message, ParseFailure):
            if any((d.get("loc") or [None])[0] == "run_id" for d in message.details or ()):
                # the path's run id, not the body: no run can have it
                raise HttpFailure(ErrorCode.RUN_NOT_FOUND,
                                  f"no run {run_id[:64]!r} on this document (not a run id)")
            raise HttpFailure(message.code, message.message.replace("tool.result", "body", 1),
                              details=message.details)
        assert isinstance(message, ToolResult)
        if await services.backend.get_run_record(document_id, run_id) is None:
            # answered before joining the document: a join would make a document (the
            # memory backend evicts idle ones for it) for every made-up run id
            raise HttpFailure(ErrorCode.RUN_NOT_FOUND,
                              f"no run {run_id[:64]!r} on this document")
        link = RunLink(services, document_id, principal, CLIENT_ID)
        try:
            await link.open()
            answer = await link.ask(message)
        finally:
            await link.close()
        if isinstance(answer, Error) and answer.code == ErrorCode.RUN_NOT_ACTIVE and \
                await applied_result(services.backend, document_id, message, principal.user_id,
                                     services.settings.log_max_events):
            return json_response({"duplicate": True})  # a retry of what the run applied
        if isinstance(answer, Error):
            raise HttpFailure.of(answer)
        if answer.duplicate:
            return json_response({"duplicate": True})
        return json_response({"status": answer.status or "accepted"})
    except HttpFailure as failure:
        return failure.response()
    except BackendUnavailable:
        return HttpFailure(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry "
                           "shortly", retry_after_ms=1000).response()
