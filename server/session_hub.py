"""The document sessions of one instance (`SessionHub`)."""

from collections.abc import Callable

from server.session import DocumentSession


class SessionHub:
    """The document sessions of this instance, created on first use, forgotten once idle
    and unused. Each `get` is a hold, given back by one `release`: a session is forgotten
    only when nobody holds it. Without holds, a holder still setting up (a takeover
    adopting a run, a connection joining: both await the backend before the session
    looks busy) could see the session forgotten under it by another holder's release;
    its run then lived in a session no message could reach."""

    def __init__(self, factory: Callable[[str], DocumentSession]) -> None:
        self._factory = factory
        self.sessions: dict[str, DocumentSession] = {}
        self._holds: dict[str, int] = {}

    def get(self, document_id: str) -> DocumentSession:
        session = self.sessions.get(document_id)
        if session is None:
            session = self.sessions[document_id] = self._factory(document_id)
        self._holds[document_id] = self._holds.get(document_id, 0) + 1
        return session

    def release(self, session: DocumentSession) -> None:
        """Give back one hold of `session` (from `get`)."""
        document_id = session.document_id
        if self.sessions.get(document_id) is not session:
            return
        holds = self._holds.get(document_id, 0) - 1
        if holds > 0:
            self._holds[document_id] = holds
            return
        self._holds.pop(document_id, None)
        self.forget_if_idle(session)

    def forget_if_idle(self, session: DocumentSession) -> None:
        """Forget `session` if it is idle and nobody holds it (say, its run just ended)."""
        document_id = session.document_id
        if session.idle and not self._holds.get(document_id) and \
                self.sessions.get(document_id) is session:
            del self.sessions[document_id]
            session.shutdown()
