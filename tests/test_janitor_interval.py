"""How often a janitor looks for lapsed leases, and PROTOCOL section 13's bound that
follows from it: a dead owner's run is taken over within `COWRITE_RUN_LEASE_S` + 1 s.
The owner renews every third of a lease, so its lease lapses 2/3 to 1 lease after the
kill; a survivor sees that at its next look."""

import pytest

from server.agent.janitor import janitor_interval
from server.settings import Settings


@pytest.mark.parametrize("lease_s", [0.2, 1.0, 2.0, 4.0, 10.0, 60.0, 3600.0])
def test_with_the_defaults_a_run_is_taken_over_within_a_lease_and_a_second(
        lease_s: float) -> None:
    most_s = Settings().janitor_interval_s
    interval = janitor_interval(lease_s, most_s)
    latest_lapse = lease_s  # the kill right after a renewal
    assert latest_lapse + interval <= lease_s + 1  # the takeover's own work: milliseconds
    assert interval <= lease_s / 4  # a short lease is looked at as often as before


def test_the_default_lease_no_longer_waits_a_quarter_lease() -> None:
    """With 10 s a quarter lease is 2.5 s: takeovers came up to 12.5 s after the kill,
    and a drained instance's runs waited up to 2.5 s for a survivor."""
    assert janitor_interval(10.0, Settings().janitor_interval_s) == 0.5
    assert janitor_interval(12.0, 3.0) == 3.0  # an operator's longer interval is kept
    assert janitor_interval(0.1, 0.5) == 0.05  # never a busy loop
