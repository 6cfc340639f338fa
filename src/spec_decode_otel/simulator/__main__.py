"""``python -m spec_decode_otel.simulator`` runs the simulator without the full CLI."""

from spec_decode_otel.simulator.cli import main

raise SystemExit(main())
