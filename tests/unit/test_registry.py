"""Detection and the plug-in registry, with plug-ins installed through real entry points.

Each test that needs plug-ins writes a ``*.dist-info`` directory (METADATA plus an
``entry_points.txt`` for the group ``spec_decode_otel.adapters``) into a temporary
directory and puts it, with tests/data/plugins (the plug-in modules), on ``sys.path``;
``reload_adapters()`` then discovers them through ``importlib.metadata`` exactly as it
would an installed distribution. The fixture restores the built-ins afterwards.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path

import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel._logging import rate_limited
from spec_decode_otel.adapters import (
    BUILTIN_ADAPTERS,
    ENTRY_POINT_GROUP,
    ParsedResponse,
    SglangAdapter,
    detect,
    registered_adapters,
    reload_adapters,
)

DATA = Path(__file__).resolve().parents[1] / "data"
PLUGINS = DATA / "plugins"
MODULE = "sdo_test_plugins"


def vllm_body() -> dict:
    path = DATA / "wire-examples" / "vllm_merged_summary_chat.json"
    return json.loads(path.read_text(encoding="utf-8"))["response"]


def acme_body() -> dict:
    return {
        "choices": [{"index": 0, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 30},
        "acme_spec": {"steps": 10, "accepted": 20, "drafted": 40},
    }


@pytest.fixture
def install_plugins(tmp_path):
    """Install entry points ``name -> "module:attr"`` as a distribution on sys.path."""
    patch = pytest.MonkeyPatch()

    def install(**entries: str):
        dist = tmp_path / "sdo_test_plugins-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: sdo-test-plugins\nVersion: 1.0\n", encoding="utf-8"
        )
        lines = [f"[{ENTRY_POINT_GROUP}]"] + [
            f"{name} = {value}" for name, value in entries.items()
        ]
        (dist / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        patch.syspath_prepend(str(PLUGINS))
        patch.syspath_prepend(str(tmp_path))
        return reload_adapters()

    yield install
    patch.undo()
    reload_adapters()


@pytest.fixture
def warnings_log(caplog):
    caplog.set_level(logging.DEBUG, logger="spec_decode_otel")

    def warnings(containing: str = "") -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and containing in r.getMessage()
        ]

    return warnings


# ---------------------------------------------------------------- order and discovery


def test_builtins_in_documented_order_without_plugins():
    assert reload_adapters() == BUILTIN_ADAPTERS
    assert [a.engine for a in BUILTIN_ADAPTERS] == [
        "vllm",
        "sglang",
        "tensorrt_llm",
        "llamacpp",
        "usage_details",
    ]
    assert registered_adapters() is registered_adapters()  # discovered once, then cached


def test_entry_point_plugin_is_listed_after_builtins_and_its_record_comes_out(install_plugins):
    adapters = install_plugins(acme=f"{MODULE}:AcmeAdapter")
    assert adapters[: len(BUILTIN_ADAPTERS)] == BUILTIN_ADAPTERS
    assert [a.engine for a in adapters[len(BUILTIN_ADAPTERS) :]] == ["acme"]
    record = record_from_json(acme_body())
    assert record is not None
    assert record.engine == "acme"
    assert record.mean_acceptance_length == 3.0
    assert record.completion_tokens is None  # the plug-in did not read usage
    assert record_from_json(vllm_body()).engine == "vllm"  # built-ins unaffected


def test_plugins_are_ordered_by_entry_point_name(install_plugins):
    adapters = install_plugins(zz_acme=f"{MODULE}:AcmeAdapter", aa_twin=f"{MODULE}:AcmeTwinAdapter")
    assert [a.engine for a in adapters[len(BUILTIN_ADAPTERS) :]] == ["acme_twin", "acme"]


def test_reload_without_the_distribution_on_sys_path_drops_the_plugin(install_plugins, tmp_path):
    assert len(install_plugins(acme=f"{MODULE}:AcmeAdapter")) == len(BUILTIN_ADAPTERS) + 1
    sys.path.remove(str(tmp_path))
    importlib.invalidate_caches()
    assert reload_adapters() == BUILTIN_ADAPTERS
    assert record_from_json(acme_body()) is None


def test_an_entry_point_naming_a_builtin_is_not_listed_twice(install_plugins):
    adapters = install_plugins(again="spec_decode_otel.adapters.vllm:VllmAdapter")
    assert adapters == BUILTIN_ADAPTERS


# ---------------------------------------------------------------- exclusivity


def test_two_adapters_claiming_one_response_give_no_record(install_plugins, warnings_log):
    install_plugins(greedy=f"{MODULE}:GreedyVllmClaimer")
    assert record_from_json(vllm_body()) is None
    (message,) = warnings_log("both claim")
    assert "VllmAdapter" in message
    assert "GreedyVllmClaimer" in message


def test_ambiguity_warning_is_logged_once_per_rate_limit_window(
    install_plugins, warnings_log, monkeypatch
):
    install_plugins(greedy=f"{MODULE}:GreedyVllmClaimer")
    for _ in range(5):
        assert record_from_json(vllm_body()) is None
    assert len(warnings_log("both claim")) == 1
    # Once the window has passed, it is logged again, with the count it held back.
    import spec_decode_otel._logging as sdo_logging

    real_monotonic = sdo_logging.time.monotonic
    monkeypatch.setattr(
        sdo_logging.time, "monotonic", lambda: real_monotonic() + rate_limited._interval + 1
    )
    assert record_from_json(vllm_body()) is None
    messages = warnings_log("both claim")
    assert len(messages) == 2
    assert "(4 similar messages suppressed)" in messages[1]


def test_two_builtins_claiming_one_response_give_no_record(warnings_log):
    body = vllm_body()
    body["timings"] = {"draft_n": 4, "draft_n_accepted": 2}
    assert record_from_json(body) is None
    assert len(warnings_log("both claim")) == 1


# ---------------------------------------------------------------- isolation


def test_plugin_raising_in_can_adapt_is_isolated_and_logged_once(install_plugins, warnings_log):
    install_plugins(raiser=f"{MODULE}:RaisesInCanAdapt")
    for _ in range(3):
        record = record_from_json(vllm_body())
        assert record is not None
        assert record.engine == "vllm"
    (message,) = warnings_log("raised")
    assert "RaisesInCanAdapt" in message
    assert "can_adapt" in message


def test_plugin_raising_in_adapt_gives_no_record_and_is_logged_once(install_plugins, warnings_log):
    install_plugins(raiser=f"{MODULE}:RaisesInAdapt")
    body = {"choices": [], "boom_spec": {}}
    assert record_from_json(body) is None
    assert record_from_json(body) is None
    (message,) = warnings_log("raised")
    assert "RaisesInAdapt" in message
    assert "in adapt" in message
    assert record_from_json(vllm_body()).engine == "vllm"


def test_plugin_returning_something_other_than_a_record_gives_none(install_plugins):
    install_plugins(bad=f"{MODULE}:ReturnsNotARecord")
    assert record_from_json({"dict_spec": {}}) is None
    assert record_from_json(vllm_body()) is not None


def test_plugin_whose_entry_point_fails_to_import_is_ignored(install_plugins, warnings_log):
    adapters = install_plugins(
        broken="sdo_broken_plugin:Adapter",
        missing="sdo_no_such_module_anywhere:Adapter",
        acme=f"{MODULE}:AcmeAdapter",
        notanadapter=f"{MODULE}:NotAnAdapter",
    )
    assert [a.engine for a in adapters[len(BUILTIN_ADAPTERS) :]] == ["acme"]
    assert record_from_json(acme_body()).engine == "acme"
    assert record_from_json(vllm_body()).engine == "vllm"
    logged = " ".join(warnings_log())
    assert "sdo_broken_plugin:Adapter" in logged
    assert "sdo_no_such_module_anywhere:Adapter" in logged
    assert "not a spec-decode adapter" in logged


def test_a_builtin_raising_is_isolated_too(monkeypatch, warnings_log):
    def explode(cls, responses):
        raise RuntimeError("boom")

    monkeypatch.setattr(SglangAdapter, "can_adapt", classmethod(explode))
    assert record_from_json(vllm_body()).engine == "vllm"
    assert len(warnings_log("SglangAdapter")) == 1


# ---------------------------------------------------------------- detect edge cases


def test_detect_of_no_responses_is_none():
    assert detect([]) is None


def test_detect_with_nothing_claimed_is_none_and_silent(warnings_log):
    plain = {"choices": [{"index": 0, "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}
    assert detect([ParsedResponse.from_dict(plain)]) is None
    assert warnings_log() == []
