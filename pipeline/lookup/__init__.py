"""Bounded side tables of the lookup join: pinning a version (:mod:`.tables`), reading a pinned version
(:mod:`.tables`) and the per-epoch record of the pinned versions (:mod:`.pins`). The join rule is in
:mod:`pipeline.operators.lookup`; docs/operators.md ("Lookup join")."""
