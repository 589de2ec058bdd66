"""Shared test infrastructure: assertion helpers, case builders, strategies."""
