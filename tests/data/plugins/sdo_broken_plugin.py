"""A plug-in module that fails at import time (its entry point must be ignored)."""

raise ImportError("this plug-in is broken on purpose")
