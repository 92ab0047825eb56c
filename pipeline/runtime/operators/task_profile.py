"""Opt-in cProfile of the executor-side task functions (``EPOCHAL_TASK_PROFILE=<dir>``).

Spark's own metric "time to execute Python code" is the wall time of a Python worker's whole ``mapInArrow``
call: it includes the time the worker waits for the JVM to send its input (shuffle read, rows converted to
Arrow) and to take its output. To see where a task's time goes, set ``EPOCHAL_TASK_PROFILE`` to a local
directory before the Spark session starts (executors of a local master inherit the driver's environment; a
cluster needs ``spark.executorEnv.EPOCHAL_TASK_PROFILE``): every profiled task function then writes one
``<name>-<pid>-<n>.prof`` file (``pstats``) there, the profiler enabled from the function's first call to its
last output batch, so the serialiser's work and the waits for the JVM (``load_stream`` / socket ``read``) show
up next to Epochal's own functions. ``python -m pipeline.runtime.operators.task_profile <dir>`` prints the merged
profile per task function. Unset (the default), a task pays one environment lookup.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

from pipeline import settings

__all__ = ["PROFILE_ENV", "profiled", "summarize"]

PROFILE_ENV = "EPOCHAL_TASK_PROFILE"

_COUNT = [0]


def profiled(name: str, fn: Callable[[Iterator], Iterator]) -> Callable[[Iterator], Iterator]:
    """``fn`` (a ``mapInArrow`` function), profiled into ``$EPOCHAL_TASK_PROFILE/<name>-*.prof`` when that
    variable is set in the worker; otherwise ``fn``'s own batches, untouched."""

    def run(batches: Iterator) -> Iterator:
        where = settings.raw(PROFILE_ENV)
        if not where:
            yield from fn(batches)
            return
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            yield from fn(batches)
        finally:
            prof.disable()
            _COUNT[0] += 1
            os.makedirs(where, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            prof.dump_stats(os.path.join(where, f"{safe}-{os.getpid()}-{_COUNT[0]}.prof"))

    return run


def summarize(directory: str, top: int = 25) -> str:
    """The profiles in ``directory`` merged per task function name: cumulative time, the top entries."""
    import io
    import pstats

    groups: dict[str, list[str]] = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith(".prof"):
            groups.setdefault(f.rsplit("-", 2)[0], []).append(os.path.join(directory, f))
    out = io.StringIO()
    for name, files in groups.items():
        st = pstats.Stats(*files, stream=out)
        out.write(f"==== {name}: {len(files)} task(s), {st.total_tt:.2f}s profiled\n")  # type: ignore[attr-defined]
        st.sort_stats("cumulative").print_stats(top)
        st.sort_stats("tottime").print_stats(top)
    return out.getvalue()


if __name__ == "__main__":  # python -m pipeline.runtime.operators.task_profile <dir> [top]
    print(summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25))
