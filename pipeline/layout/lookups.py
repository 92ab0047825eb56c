"""Lookup-join keys: the per-epoch record of a side table's pinned version.

::

    <checkpoint root>/<job>/lookups/<uid>/epoch-<n:010d>.json   # written once, the first time epoch n is processed

(what a record holds and why it is written once: :mod:`pipeline.lookup.pins`).
"""
from __future__ import annotations

import re

__all__ = ["LOOKUPS_DIR", "lookup_pins_prefix", "lookup_pin_uri", "lookup_pin_epoch"]

#: the directory of every lookup join's pins under the job root
LOOKUPS_DIR = "lookups"

_PIN = re.compile(r"epoch-(\d+)\.json$")


def lookup_pins_prefix(job_root: str, uid: str) -> str:
    """``<job root>/lookups/<uid>/``: every pin of lookup join ``uid``."""
    return f"{job_root.rstrip('/')}/{LOOKUPS_DIR}/{uid}/"


def lookup_pin_uri(job_root: str, uid: str, epoch: int) -> str:
    """``<job root>/lookups/<uid>/epoch-<n:010d>.json``: the pin of epoch ``epoch``."""
    return f"{lookup_pins_prefix(job_root, uid)}epoch-{epoch:010d}.json"


def lookup_pin_epoch(uri: str) -> int | None:
    """The epoch of a pin's URI, None for any other key."""
    m = _PIN.search(uri)
    return int(m.group(1)) if m else None
