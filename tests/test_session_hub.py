"""The hub's holds on document sessions (server/session.py `SessionHub`): a session is
forgotten only when idle and held by nobody. The rolling-restart test found a run
adopted into a session that another holder's release had just forgotten: the run
went on where no message could reach it, and its tool call timed out."""

from server.app import build_services
from tests.harness import make_settings


def test_a_session_is_kept_while_anyone_holds_it() -> None:
    hub = build_services(make_settings()).hub
    adopting = hub.get("doc")  # a takeover, still reading the checkpoint (not busy yet)
    dispatching = hub.get("doc")  # a forwarded message, handled meanwhile
    assert dispatching is adopting
    hub.release(dispatching)
    assert hub.sessions.get("doc") is adopting, "forgotten under its other holder"
    assert hub.get("doc") is adopting
    hub.release(adopting)
    hub.release(adopting)
    assert "doc" not in hub.sessions  # idle and unheld: forgotten
    fresh = hub.get("doc")
    assert fresh is not adopting
    hub.release(adopting)  # a stale release of the old session changes nothing
    assert hub.sessions.get("doc") is fresh


def test_an_idle_session_goes_when_its_run_ends_only_if_nobody_holds_it() -> None:
    hub = build_services(make_settings()).hub
    session = hub.get("doc")
    hub.forget_if_idle(session)  # a run ended; a connection still holds the session
    assert hub.sessions.get("doc") is session
    hub.release(session)
    assert "doc" not in hub.sessions
