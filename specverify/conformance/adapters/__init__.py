"""Adapters: other engines' kernels behind the registry's op interface.

An adapter module imports its engine only when its implementation object is first used, and
raises `EngineMissing` (one line naming the package) when the engine is not installed; the
conformance plugin turns that into a skip of the whole run with that line.

The interface an implementation object offers (docs/conformance.md):
- `name`: how the report names it (engine and version);
- `conventions`: a dict of convention -> value (specverify.conformance.conventions), applying to
  every op, and optionally `op_conventions`: op name -> dict overriding them for one op;
- one method per registry op it implements, called with the sample's arguments as keywords and
  returning a dict of the outputs the record compares (array-likes);
- optionally `versions()`: package -> version, recorded in the report.
"""

from __future__ import annotations

import importlib


class EngineMissing(RuntimeError):
    """The engine an adapter wraps is not installed here (the message is one line naming it)."""


def require(module: str, package: str):
    """Import `module`, or raise EngineMissing naming the pip package that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise EngineMissing(f"{package} is not installed (import {module} failed: {err})") from None


class Unsupported(NotImplementedError):
    """The engine has no way to compute this sample (a parameter it does not offer): the sample is
    reported as unsupported by that engine, not as a difference."""
