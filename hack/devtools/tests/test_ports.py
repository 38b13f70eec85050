"""The test bed's port picker: ports no outgoing connection can take, one share per worker."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from gangcheck_dev.testbed import process
from gangcheck_dev.testbed.process import free_ports


def test_ports_are_below_the_ephemeral_range_distinct_and_never_handed_out_twice() -> None:
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    # below the ephemeral range, unless it leaves fewer than 1000 ports above LOWEST_PORT
    below = max(ephemeral, process.LOWEST_PORT + 1000)
    first = free_ports(5)
    second = free_ports(5)
    assert all(process.LOWEST_PORT <= port < below for port in first + second)
    assert len(set(first + second)) == 10


def test_each_xdist_worker_gets_its_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    for index in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        assert all(port % 3 == index for port in free_ports(4))


def test_a_port_something_holds_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    try:
        # the only candidate in a one-port range is the one held: no port to give
        port = int(held.getsockname()[1])
        monkeypatch.setattr(process, "_port_range", lambda: (port, port + 1))
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        with pytest.raises(OSError, match="no 1 free ports"):
            process.free_ports(1)
    finally:
        held.close()
