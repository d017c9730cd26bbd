"""The cluster's nodes as the metadata records them: their addresses."""

from __future__ import annotations

from engine.runtime.meta_members import split_address


def test_addresses_in_the_metadata_parse_or_are_left_alone() -> None:
    assert split_address("127.0.0.1:7001") == ("127.0.0.1", 7001)
    assert split_address("[::1]:7002") == ("::1", 7002)
    assert split_address("host.example:80") == ("host.example", 80)
    for bad in ["", "host", "host:", ":80", "host:0", "host:99999", "host:x"]:
        assert split_address(bad) is None, bad
