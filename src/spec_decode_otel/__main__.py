"""``python -m spec_decode_otel`` runs the CLI (handy where scripts are not on PATH)."""

from spec_decode_otel.cli import main

raise SystemExit(main())
