"""``--help`` of the service commands: the usage text and exit 0, or nothing at all."""

from __future__ import annotations

import pytest

from relay_batches.usage import answer_help


def test_help_prints_the_usage_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        answer_help("relay-notifier", "POSTs webhooks.", ["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: relay-notifier\n\nPOSTs webhooks.\n\nTakes no arguments")


def test_without_a_help_flag_the_service_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert answer_help("relay-notifier", "POSTs webhooks.", []) is None
    assert capsys.readouterr().out == ""
