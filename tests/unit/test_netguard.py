"""The SSRF guard's decision on addresses (no connection is opened)."""

from __future__ import annotations

import pytest

from relay_batches.netguard import parse_networks, refusal_reason


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.64.0.1", "not globally routable"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("2002:7f00:1::", "loopback"),
        ("64:ff9b::a00:1", "private"),
        ("fe80::1", "link-local"),
        ("169.254.1.1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("fd12:3456::1", "private"),
    ],
)
def test_forbidden_addresses_are_refused(address: str, reason: str) -> None:
    refused = refusal_reason(address)
    assert refused is not None
    assert reason in refused


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal_reason(address) is None


def test_the_allow_list_opens_only_its_networks() -> None:
    allow = parse_networks("127.0.0.0/8, ::1/128")
    assert refusal_reason("127.0.0.1", allow) is None
    assert refusal_reason("127.9.9.9", allow) is None
    assert refusal_reason("::1", allow) is None
    assert refusal_reason("::ffff:127.0.0.1", allow) is None
    assert refusal_reason("10.0.0.1", allow) is not None
    assert refusal_reason("169.254.169.254", allow) is not None


def test_bad_networks_are_rejected() -> None:
    with pytest.raises(ValueError):
        parse_networks("127.0.0.0/33")
    assert parse_networks("") == ()
