"""The run machine's fast paths give exactly what the general code gave: a result's
call token accepted by comparison with the issued one only where the full check
accepts it, and refused otherwise with the full check's own words."""

from hypothesis import given, settings
from hypothesis import strategies as st

from server.agent.run_state import PendingCall, RunState, ToolOutcome
from server.agent.steps import ClientToolResult, call_token_problem
from server.auth import Authenticator, CallGrant
from server.settings import Settings

AUTH = Authenticator(Settings(jwt_secret="hot-paths-machine-0123456789abcdef"))
OTHER_KEY = Authenticator(Settings(jwt_secret="another-secret-0123456789abcdef00"))
STATE = RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice", client_id="tab",
                 prompt="p", model="m", max_steps=3)
EXPIRES = 1_000_000


def _token(signer: Authenticator, run_id: str = "r1", call_id: str = "c1", user: str = "alice",
           document_id: str = "d1", expires: int = EXPIRES) -> str:
    return signer.issue_call_token(CallGrant(run_id, call_id, user, document_id, expires))


ISSUED = _token(AUTH)
TOKENS = [
    ISSUED, _token(AUTH, user="bob"), _token(AUTH, call_id="c2"), _token(AUTH, run_id="r2"),
    _token(AUTH, document_id="d2"), _token(AUTH, expires=EXPIRES - 1),
    _token(AUTH, expires=EXPIRES + 1), _token(OTHER_KEY), ISSUED[:-2] + "AA", ISSUED + "A",
    ISSUED[:-1], "garbage", "", "a.b", ISSUED.replace(".", "\u00e9."), "\u00e9" * len(ISSUED),
]


def _pending(token: str | None, expires: int = EXPIRES) -> PendingCall:
    return PendingCall("c1", "read", {}, "tool", "client", expires, token)


@settings(max_examples=400, deadline=None)
@given(given_token=st.sampled_from(TOKENS) | st.text(max_size=200), held=st.booleans(),
       user=st.sampled_from(["alice", "bob", ""]),
       at_ms=st.sampled_from([0, EXPIRES - 1, EXPIRES, EXPIRES + 1, 2 * EXPIRES]),
       held_expires=st.sampled_from([EXPIRES - 1, EXPIRES, EXPIRES + 5]))
def test_token_fast_path_answers_as_the_full_check(given_token: str, held: bool, user: str,
                                                   at_ms: int, held_expires: int) -> None:
    # What the run holds is what it issued for the call (or nothing): the machine's invariant.
    issued = _token(AUTH, expires=held_expires)
    current = _pending(issued if held else None, held_expires)
    for token in (given_token, issued):
        event = ClientToolResult("c1", token, ToolOutcome("ok"), user, at_ms)
        expected = AUTH.check_call_token(token, STATE.grant("c1", user, 0), at_ms)
        assert call_token_problem(AUTH, STATE, current, event) == expected


def test_token_fast_path_table() -> None:
    """Every listed token, user and time against the issued token: the same verdicts;
    only tokens validly issued for the call, its user and an unexpired time pass."""
    current = _pending(ISSUED)
    accepted = []
    for token in TOKENS:
        for user in ("alice", "bob"):
            for at_ms in (0, EXPIRES, EXPIRES + 1):
                event = ClientToolResult("c1", token, ToolOutcome("ok"), user, at_ms)
                got = call_token_problem(AUTH, STATE, current, event)
                assert got == AUTH.check_call_token(token, STATE.grant("c1", user, 0), at_ms)
                if got is None:
                    accepted.append((token, user, at_ms))
    bob, early, late = TOKENS[1], TOKENS[5], TOKENS[6]
    assert accepted == [(ISSUED, "alice", 0), (ISSUED, "alice", EXPIRES), (bob, "bob", 0),
                        (bob, "bob", EXPIRES), (early, "alice", 0), (late, "alice", 0),
                        (late, "alice", EXPIRES), (late, "alice", EXPIRES + 1)]
