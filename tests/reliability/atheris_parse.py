"""Coverage-guided fuzzing (atheris / libFuzzer) of the offline parser.

Target: ``parse_payloads`` and ``record_from_text`` on arbitrary bytes, seeded with real
payloads. Properties, checked on every input:

- ``parse_payloads`` raises nothing but ValueError (its documented error);
- ``record_from_text`` agrees with ``record_from_json`` on the decoded payloads;
- a record, when there is one, is exportable JSON (no NaN/inf) that validates back to
  an equal record (every invariant holds).

Run it by hand for as long as you like::

    python tests/reliability/atheris_parse.py -max_total_time=600 CORPUS_DIR

``tests/reliability/test_atheris.py`` runs it for a bounded number of iterations
(``SPEC_DECODE_OTEL_ATHERIS_RUNS``). A crash is written as ``crash-<sha1>`` under
``-artifact_prefix`` and the process exits non-zero.
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports(include=["spec_decode_otel"]):
    from spec_decode_otel.payloads import parse_payloads, record_from_json, record_from_text
    from spec_decode_otel.record import SpecDecodeAcceptanceRecord


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        payloads = parse_payloads(text)
    except ValueError:
        return
    record = record_from_json(payloads[0] if len(payloads) == 1 else payloads)
    assert record_from_text(text) == record
    if record is not None:
        as_json = record.model_dump(mode="json")
        json.dumps(as_json, allow_nan=False)
        assert SpecDecodeAcceptanceRecord.model_validate(as_json) == record


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
