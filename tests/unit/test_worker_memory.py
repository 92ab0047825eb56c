"""A worker gives freed memory back after a task (pipeline.worker_memory): Arrow's pool and glibc's heaps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, os
import pyarrow as pa
from pipeline.worker_memory import release_memory

def rss():
    for ln in open("/proc/self/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) << 10

out = {"pool": pa.default_memory_pool().backend_name}
# Arrow: 25 arrays of 4 MB computed into its pool, freed; the pool keeps what it freed until its decay time
import numpy as np
import pyarrow.compute as pc
base = pa.array(np.arange(500_000, dtype=np.int64))
arrays = [pc.add(base, i) for i in range(25)]
out["arrow_held"] = rss()
del arrays
out["arrow_freed"] = rss()
release_memory()
out["arrow_released"] = rss()
# glibc: 100k Python strings of 2 KB (above pymalloc's 512 bytes), every 10th kept: holes in the heap
held = [("%08d" % i) + "x" * 2000 for i in range(100_000)]
keep = held[::10]
del held
out["heap_freed"] = rss()
release_memory()
out["heap_released"] = rss()
print("RESULT " + json.dumps(out))
"""


def _run(env_extra: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_extra}
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line is not None, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(line[len("RESULT "):])


def test_freed_memory_goes_back_to_the_os_and_the_switch_turns_it_off():
    mib = 1 << 20
    on = _run({"EPOCHAL_WORKER_RELEASE_MEMORY": "1"})
    # 100 MB of arrays freed: the pool (mimalloc in the pyarrow wheels) keeps them until released
    assert on["arrow_freed"] - on["arrow_released"] > 60 * mib, on
    # 180 MB of 2 KB strings freed around the kept tenth: malloc_trim returns the pages of the holes
    assert on["heap_freed"] - on["heap_released"] > 80 * mib, on
    off = _run({"EPOCHAL_WORKER_RELEASE_MEMORY": "0"})
    assert off["arrow_freed"] - off["arrow_released"] < 20 * mib, off
    assert off["heap_freed"] - off["heap_released"] < 20 * mib, off
    # without the release, the strings cannot reuse what Arrow's pool keeps: the process holds both
    assert off["heap_freed"] - on["heap_freed"] > 60 * mib, (on, off)
