"""The version of fastops. pyproject.toml holds the same number (tests/test_layout.py checks that
they agree); the tuner's cache fingerprint reads it here (importing the package's
__init__ from inside it would be an import circle)."""

__version__ = "0.1.0"
