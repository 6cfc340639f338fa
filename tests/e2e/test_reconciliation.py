"""End to end: the dashboard's "Client vs server" row reconciles the instrumented clients'
counters with the servers' own, through the real collector and Prometheus.

The servers are two simulator subprocesses that export vLLM's and llama.cpp's
server-side counters on ``/metrics`` (simulator/server_metrics.py); Prometheus scrapes
them with ``server_address``/``server_port`` labels (e2e_stack.write_prometheus_config).
The workload and what it left behind are conftest.py's ``reconciliation``:

- phase ``full``: every request's stats reach the client: coverage is exactly 1.0 on
  both servers, and the clients' totals equal the servers';
- phase ``partial``: some vLLM streams are made without ``include_usage``, so vLLM
  (0.33.0; wire-formats.md) sends their stats nowhere: the vLLM server's coverage drops
  below 1.0, to exactly the clients' accepted tokens over the server's, and llama.cpp's
  stays 1.0;
- both simulators listen on 127.0.0.1 (two engines on one host): with the host and one
  port chosen, the row shows that server only.

The coverage panel's formula is evaluated over cumulative totals (``increase(X[range])``
→ ``X``), which are exact; the panels' own expressions, as Grafana sends them, must
return a finite value for each server.
"""

from __future__ import annotations

import math

import httpx
import pytest
from e2e_stack import prom_query

from conftest import Reconciliation, all_selected, host_port, row_targets, substitute

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _server(reconciliation: Reconciliation, flavour: str) -> str:
    host, port = host_port(reconciliation.servers[flavour])
    return f"{host}:{port}"


def test_coverage_is_one_when_every_request_is_recorded(reconciliation: Reconciliation) -> None:
    full = reconciliation.phases["full"]
    vllm, llamacpp = _server(reconciliation, "vllm"), _server(reconciliation, "llamacpp")
    for server in (vllm, llamacpp):
        assert full.server[server]["accepted"] > 0, server
        assert full.client[server] == full.server[server], server
    assert full.coverage == {vllm: 1.0, llamacpp: 1.0}


def test_streams_without_include_usage_lower_the_coverage(
    reconciliation: Reconciliation,
) -> None:
    full, partial = reconciliation.phases["full"], reconciliation.phases["partial"]
    vllm, llamacpp = _server(reconciliation, "vllm"), _server(reconciliation, "llamacpp")
    # The server counted the stats-less streams; the clients did not.
    client_added = partial.client[vllm]["accepted"] - full.client[vllm]["accepted"]
    server_added = partial.server[vllm]["accepted"] - full.server[vllm]["accepted"]
    assert 0 < client_added < server_added
    expected = partial.client[vllm]["accepted"] / partial.server[vllm]["accepted"]
    assert partial.coverage[vllm] == pytest.approx(expected, rel=1e-12)
    assert partial.coverage[vllm] < 1.0
    assert partial.client[llamacpp] == partial.server[llamacpp]
    assert partial.coverage[llamacpp] == 1.0
    assert set(partial.coverage) == {vllm, llamacpp}


def test_every_panel_of_the_row_returns_a_value_per_server(
    reconciliation: Reconciliation, prom: httpx.Client
) -> None:
    """The row's expressions as Grafana sends them (all servers and ports, a 10-minute
    range; conftest.substitute fails on a variable it leaves)."""
    servers = {_server(reconciliation, f) for f in reconciliation.servers}
    targets = row_targets()
    assert len(targets) == 6
    problems = []
    for title, target in targets:
        expr = substitute(target["expr"], all_selected())
        values = {
            f"{r['metric'].get('server_address')}:{r['metric'].get('server_port')}": float(
                r["value"][1]
            )
            for r in prom_query(prom, expr)
        }
        ours = {s: v for s, v in values.items() if s in servers}
        if set(ours) != servers or not all(math.isfinite(v) and v > 0 for v in ours.values()):
            problems.append(f"{title!r} {target['refId']}: {values}")
    assert not problems, "\n".join(problems)


def test_the_row_shows_only_the_chosen_port(
    reconciliation: Reconciliation, prom: httpx.Client
) -> None:
    """Both simulators listen on 127.0.0.1, each on its own port: two engines on one
    host. With the host and one port chosen, every panel of the row (the clients'
    series and the servers' own) shows that server only; it selected by address only,
    so the host's other engine stayed in."""
    hosts = {host_port(url)[0] for url in reconciliation.servers.values()}
    assert len(hosts) == 1, reconciliation.servers  # one host, two ports
    (host,) = hosts
    for flavour in reconciliation.servers:
        chosen = _server(reconciliation, flavour)
        values = all_selected(server=host, port=chosen.rsplit(":", 1)[1])
        for title, target in row_targets():
            shown = {
                f"{r['metric'].get('server_address')}:{r['metric'].get('server_port')}"
                for r in prom_query(prom, substitute(target["expr"], values))
            }
            assert shown == {chosen}, (flavour, title, target["refId"], shown)
