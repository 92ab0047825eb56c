"""Determinism under replay on a real moto S3 server (sources, checkpoints and sinks on s3://), run as a child
process of ``test_replay_determinism.py`` (the Spark workers must inherit the ``AWS_*`` variables): a deterministic
and a counter process job, 2 epochs each, replay of the latest checkpoint; prints ``RESULT {json}``."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

import replay_jobs as rj  # noqa: E402
from data import generate  # noqa: E402


def main(root: str) -> None:
    from pipeline.config import load_config
    from pipeline.fileio import file_io_for
    from pipeline.quality.replay import replay_checkpoint
    from pipeline.runtime.driver.runner import JobRunner
    fio = file_io_for(root)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), seed=4, epochs=3)
        for f in sorted(Path(tmp).rglob("*.parquet")):
            fio.write_bytes(f"{root}/src/{f.relative_to(tmp).as_posix()}", f.read_bytes())
    cfg = load_config(env={}, source_uri=f"{root}/src", checkpoint_uri=f"{root}/ckpt", sink_uri=f"{root}/sink",
                      clock_now="2027-01-01T00:00:00Z", epoch_seconds=60, parallelism=2)
    out: dict = {}
    for fn, name in ((rj.deterministic_fn, "bt_replay_s3_det"), (rj.counter_fn, "bt_replay_s3_counter")):
        r = JobRunner(rj.process_job(fn, name), cfg, echo=lambda m: None)
        r.run(epochs=2)
        before = {(f.uri, f.size) for f in fio.list(root + "/ckpt") + fio.list(root + "/sink")}
        res = replay_checkpoint(r, r.coordinator.store.latest())
        after = {(f.uri, f.size) for f in fio.list(root + "/ckpt") + fio.list(root + "/sink")}
        out[name] = {"scratch": res.scratch, "not_checked": dict(res.not_checked), "unchanged": before == after,
                     "differs": sorted(o.obj for o in res.objects if not o.equal), "objects": len(res.objects),
                     "leftover": len(fio.list(root + "/ckpt/_replay")) + len(fio.list(root + "/sink/_replay"))}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
