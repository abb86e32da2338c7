"""The version of iolens (as pyproject.toml gives it), where every layer can read it."""

__version__ = "0.1.0"
