"""Cooldown of failing deployments, on a fake clock."""

from __future__ import annotations

from relay_batches.router.cooldown import CooldownPolicy, Cooldowns


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_failures_within_the_window() -> None:
    clock = FakeClock()
    cooldowns = Cooldowns(CooldownPolicy(threshold=3, window_s=10, cooldown_s=30), clock)
    assert cooldowns.record_failure("a") is False
    clock.now += 1
    assert cooldowns.record_failure("a") is False
    assert not cooldowns.cooling("a")
    clock.now += 1
    assert cooldowns.record_failure("a") is True
    assert cooldowns.cooling("a")
    assert not cooldowns.cooling("b")


def test_failures_outside_the_window_do_not_count() -> None:
    clock = FakeClock()
    cooldowns = Cooldowns(CooldownPolicy(threshold=3, window_s=10, cooldown_s=30), clock)
    cooldowns.record_failure("a")
    clock.now += 6
    cooldowns.record_failure("a")
    clock.now += 6
    assert cooldowns.record_failure("a") is False
    assert not cooldowns.cooling("a")


def test_closes_after_the_cooldown_period() -> None:
    clock = FakeClock()
    cooldowns = Cooldowns(CooldownPolicy(threshold=1, window_s=10, cooldown_s=30), clock)
    assert cooldowns.record_failure("a") is True
    clock.now += 29.9
    assert cooldowns.cooling("a")
    clock.now += 0.1
    assert not cooldowns.cooling("a")
    # A fresh failure after the cooldown may open it again.
    assert cooldowns.record_failure("a") is True


def test_failures_while_cooling_do_not_extend_it() -> None:
    clock = FakeClock()
    cooldowns = Cooldowns(CooldownPolicy(threshold=1, window_s=10, cooldown_s=30), clock)
    cooldowns.record_failure("a")
    clock.now += 20
    assert cooldowns.record_failure("a") is False
    clock.now += 10
    assert not cooldowns.cooling("a")


def test_a_success_forgets_recent_failures() -> None:
    clock = FakeClock()
    cooldowns = Cooldowns(CooldownPolicy(threshold=2, window_s=10, cooldown_s=30), clock)
    cooldowns.record_failure("a")
    cooldowns.record_success("a")
    assert cooldowns.record_failure("a") is False
    assert not cooldowns.cooling("a")
