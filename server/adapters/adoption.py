"""Where a chat's run begins in the document log, for an instance that did not start it.

Behind a load balancer that is not sticky, the request answering a chat's
pending tool call (or reconnecting to its stream) may reach an instance that
did not start the chat's run. The run itself is the cluster's: its owner
drives it, and the cluster link carries this instance's answer to it. Only the
adapter's view of the run (its translated items, the call waiting on the
frontend and that call's token) lived in the other instance, and all of it
comes from the run's events, which the document log keeps as the run's user
sees them, tokens included. So this instance rebuilds the view from the log's
tail (`run_events`) and then follows the run live through a link that resumes
right after the last event read: the session's own gapless resume.
"""

from protocol.server import RunStarted
from server.adapters.link import parse_event
from server.backends.base import Backend, LoggedEvent

FIRST_WINDOWS = (256, 4096)
"""How far back the log is read first: a run's events are usually the last few hundred."""


async def run_events(backend: Backend, document_id: str, run_id: str, log_max_events: int
                     ) -> tuple[str, int, list[LoggedEvent]]:
    """(epoch, last seq read, the logged events from the run's `run.started` on).

    Reads ever larger windows of the log's tail, up to what it keeps
    (`log_max_events`). When the run's start is no longer kept, what is kept
    is returned: the caller takes this run's events from it, and the call it
    waits on, the last thing the run did, is always among them."""
    head = await backend.head(document_id)
    found: list[LoggedEvent] = []
    for window in sorted({min(size, log_max_events) for size in
                          (*FIRST_WINDOWS, log_max_events)}):
        after = max(0, head.last_seq - window)
        result = await backend.read_after(document_id, head.epoch, after, head.last_seq)
        if not isinstance(result, list):
            break
        found = result
        start = _start_of(found, run_id)
        if start is not None:
            return head.epoch, head.last_seq, found[start:]
        if after == 0:
            break
    return head.epoch, head.last_seq, found


def _start_of(events: list[LoggedEvent], run_id: str) -> int | None:
    for index in range(len(events) - 1, -1, -1):
        logged = events[index]
        if logged.type == "run.started":
            event = parse_event(logged.frame)
            if isinstance(event, RunStarted) and event.run_id == run_id:
                return index
    return None


__all__ = ["run_events"]
