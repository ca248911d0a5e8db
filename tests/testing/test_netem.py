"""The emulated lossy network (lightning_dlac/testing/netem.py) on its own: its settings are checked, and a TCP
stream between two namespaces arrives whole while the forwarder drops packets. The training run on it is
tests/comm/test_reliability.py::test_a_lossy_jittery_network_ends_with_the_clean_run_s_weights_and_metrics."""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from lightning_dlac.testing import netem


@pytest.mark.parametrize("kwargs", [dict(loss=1.0), dict(loss=-0.1), dict(delay_ms=(50.0, 5.0)), dict(ranks=0)])
def test_settings_out_of_range_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        netem.LossyNetwork(**kwargs)


@pytest.mark.slow  # runs `ip`
@pytest.mark.timeout(120)
@pytest.mark.skipif(netem.unavailable() is not None, reason=f"no lossy network here: {netem.unavailable()}")
def test_a_tcp_stream_crosses_the_lossy_link_whole_while_packets_are_dropped() -> None:
    data = os.urandom(2 << 20)
    received: list[bytes] = []
    with netem.LossyNetwork(ranks=2, loss=0.01, delay_ms=(5, 50), seed=1) as network:
        listening = threading.Event()

        def serve() -> None:
            netem.enter_namespace(network.namespace(0))  # this thread only, and the sockets it opens
            with socket.create_server((network.address(0), 5000)) as server:
                listening.set()
                conn, _ = server.accept()
                with conn:
                    chunks = []
                    while chunk := conn.recv(1 << 16):
                        chunks.append(chunk)
                    received.append(b"".join(chunks))

        def send() -> None:
            netem.enter_namespace(network.namespace(1))
            with socket.create_connection((network.address(0), 5000), timeout=60) as conn:
                conn.sendall(data)

        server = threading.Thread(target=serve)
        server.start()
        assert listening.wait(30)
        sender = threading.Thread(target=send)
        sender.start()
        sender.join(90)
        server.join(90)
        counts = network.counts
    assert received and hashlib.sha256(received[0]).digest() == hashlib.sha256(data).digest()
    assert counts.dropped > 0 and counts.forwarded > 1000, counts  # TCP resent what was lost
    assert not any(name.startswith(f"dlacnet{os.getpid()}") for name in os.listdir("/var/run/netns"))
