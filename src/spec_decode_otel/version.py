"""The one place the package version lives (read by hatch and by ``__version__``)."""

__version__ = "0.1.0"
