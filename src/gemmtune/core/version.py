"""The package version, in one place (the store keys timings by it)."""

__version__ = "0.1.0"
