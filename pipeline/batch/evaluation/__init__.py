"""Batch evaluation of a job: the whole dataflow as ONE Spark batch plan over a source prefix.

One rule module per operator (:mod:`.stateless` for filter/select/union, :mod:`.join` with :mod:`.join_keys` and
:mod:`.join_repeats`, :mod:`.aggregate`, :mod:`.window`, :mod:`.dedup`, :mod:`.process`, :mod:`.sink`), the
source prefix (:mod:`.prefix`, :mod:`.sources`, :mod:`.rounds`), the shared state of one compilation
(:mod:`.context`) and :mod:`.plan`, which composes them. Bootstrap (:mod:`pipeline.batch.bootstrap`) writes the
result as a savepoint; validation (:mod:`pipeline.quality.recovery`) compares it with a checkpoint.

This is the meaning of a job that does not depend on epochs (docs/batch.md): the committed output and the
operator state after checkpoint ``n`` - whatever crashes, restores, rescales and rewinds happened - equal
this plan evaluated over the source rows before barrier ``n``. It uses plain Spark SQL / DataFrame operators
(joins, group-bys) and shares nothing with the epoch runtime's operator tasks or state
files; only the source reading (file listing, bad-record rules) is the runtime's.

Rules (``E`` = epoch length, ``end(k) = (k+1)E``, ``p(x)`` = processing epoch of row ``x``, see
``evaluation.prefix``, ``t_x`` = its ``_ingest_ts``, ``c_k = end(k) - ttl`` the TTL cutoff of epoch ``k``):

* ``filter`` / ``select``: as Spark SQL; ``_ingest_ts`` is kept through selects like the runtime does.
* ``join`` (inner): a pair ``(l, r)`` with equal keys is emitted iff ``min(t_l, t_r) >= c_m`` with
  ``m = max(p(l), p(r))`` (both rows were alive when the later one arrived); no TTL: every pair.
  Outer (``how`` = left/right/full): a row with no such pair is emitted with nulls for the other side once
  it expires, i.e. by checkpoint ``n`` iff ``t_x < c_L`` (``L``: the low watermark of the inputs recorded in
  checkpoint ``n``, ``n`` when they were aligned).
  State at ``n``: the rows with ``t_x >= c_L``, minus - on a side whose partner side is declared ``unique`` -
  the rows that matched (they left state). Rows violating a ``unique`` declaration are dead-lettered by the
  runtime, which decides per round against the rows it still holds: keys with one row per unique side are computed
  as above, the keys that repeat by a per-key fold of the kernel's rule over (epoch, round) (``join_repeats._unique_fold``,
  ``join_repeats.fold_repeats``); their number is reported (a null key is no key: never a violation, never a
  match). Jobs built with the older join (no
  ``how``/``unique``: one match per key, both rows leave state) are evaluated as ``unique="both"``.
* ``aggregate``: totals per key over all input rows (count = rows, sum, min, max; floating sums exact in
  ``decimal(38,9)``, then correctly rounded to double, like the runtime's state); an upsert sink holds them.
  A null key is one group (SQL ``GROUP BY``): its row is in the state and the sink exactly once.
* What is not modelled is listed in ``result.BatchResult.unchecked`` (never skipped silently): an append sink
  of an aggregate (a changelog whose rows depend on round boundaries), an upsert sink of a non-aggregate,
  operators fed by an aggregate, ``process`` nodes, and ``deduplicate`` fed by a join after an unaligned backlog
  drain (or in a drained lineage without round-0 logs) or fed by a process's output (see docs/batch.md).
* ``deduplicate``: per key, a fold over processing rounds (see ``dedup.dedup``,
  ``evaluation.rounds``; the round is carried through selects, joins, deduplicates and final windows' fired
  rows), after an unaligned backlog drain over the consumption order (checkpoint, round) with the kernel's
  sequential rule (``dedup._sequential_fold``); state: the held keys alive at ``n``.
* ``window`` (docs/windows.md): records with a key and an event time; per (channel, epoch) the highest event
  time, folded into ``W(m)`` exactly as the page defines it (running maximum per channel, minimum over the
  channels active in ``m``, minus the out-of-orderness, never decreasing); a (record, window) pair counts iff
  ``window_end + L > W(p(x) - 1)``; records whose every window is closed are late (counted, dead-lettered by the
  runtime). ``emit="final"``: the windows with ``window_end + L <= W(m)`` for some ``m <= n`` (as ``W`` never
  decreases: ``<= W`` of the last epoch with records), aggregated over their on-time records. ``emit="update"``
  (an upsert sink keyed by the key and ``window_start``): every window with an on-time record, aggregated over
  its on-time records so far. State at ``n``: the records whose last window has not fired
  (``floor(t/D)*D + S + L > W(n)``) and the watermark table (``window._window_state``).
"""

