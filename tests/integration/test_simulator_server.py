"""The simulator's listening socket: what a load test over keep-alive connections needs.

uvicorn writes a response's head and body separately. Unless the accepted socket has
TCP_NODELAY, Nagle holds the second write until the client's delayed ACK (~40 ms on
Linux), so every request on a reused connection stalled for ~44 ms.
"""

from __future__ import annotations

import socket

import httpx

from spec_decode_otel.simulator import SimulatorServer
from spec_decode_otel.simulator.server import bind_socket

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_bound_socket_says_it_is_tcp_so_accepted_sockets_get_nodelay() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_accepted_keep_alive_connection_has_nagle_off() -> None:
    with SimulatorServer() as sim, httpx.Client() as client:
        for _ in range(3):  # the same keep-alive connection each time
            response = client.post(sim.base_url + "/chat/completions", json=BODY)
            assert response.status_code == 200
        server = sim._server
        assert server is not None
        connections = list(server.server_state.connections)
        assert len(connections) == 1
        accepted = connections[0].transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
