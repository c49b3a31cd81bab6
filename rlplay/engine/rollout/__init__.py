"""Generators of fragments: ``same`` (in this process)."""
from . import same

__all__ = ["same"]
