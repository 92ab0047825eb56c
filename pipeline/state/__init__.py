"""Keyed operator state, partitioned by key group."""
