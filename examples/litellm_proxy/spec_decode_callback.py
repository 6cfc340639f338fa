"""spec-decode-otel inside the LiteLLM proxy: one set-up for every client of the gateway.

The proxy loads this module because config.yaml names ``spec_decode_callback.spec_decode``
under ``litellm_settings: callbacks`` (LiteLLM looks for the module next to the config
file). ``setup()`` builds the OpenTelemetry SDK from the ``OTEL_*`` variables and
instruments the ``openai`` SDK that LiteLLM sends ``openai/`` routes through (streams
included); the callback covers the calls LiteLLM sends with its own HTTP handler
(``hosted_vllm/`` chat). Each call gets one record, whichever of the two sees it (see
README.md here).

Needs, in the proxy's environment: ``pip install 'spec-decode-otel[otlp]'``.
``SPEC_DECODE_RECORDS_FILE=records.jsonl`` also writes the records file that
``spec-decode-otel summarize`` reads.
"""

import os

import spec_decode_otel
from spec_decode_otel.integrations.litellm import SpecDecodeLiteLLMCallback
from spec_decode_otel.records import RecordsFileProcessor

records = os.environ.get("SPEC_DECODE_RECORDS_FILE")
spec_decode_otel.setup(
    "litellm-proxy", span_processors=[RecordsFileProcessor(records)] if records else []
)
spec_decode = SpecDecodeLiteLLMCallback()
