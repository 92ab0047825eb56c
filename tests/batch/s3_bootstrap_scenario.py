"""Bootstrap on a real moto S3 server (sources, checkpoints, savepoint and sinks on s3://), run as a child process
of ``test_bootstrap.py`` (the Spark workers must inherit the ``AWS_*`` variables): bootstrap at barrier n, restore,
run the remaining epochs; prints ``RESULT {json}`` comparing the sinks and state with a full run."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from batch_jobs import join_agg  # noqa: E402
from data import E_US, T0, generate  # noqa: E402


def main(root: str) -> None:
    import io

    import pyarrow.parquet as pq

    from pipeline.batch.bootstrap.savepoint import bootstrap
    from pipeline.config import load_config
    from pipeline.fileio import file_io_for
    from pipeline.runtime.driver.runner import JobRunner
    fio = file_io_for(root)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), seed=4, epochs=4, n_left=60, repeated=True)
        for f in sorted(Path(tmp).rglob("*.parquet")):
            fio.write_bytes(f"{root}/src/{f.relative_to(tmp).as_posix()}", f.read_bytes())

    def runner(name: str, **kw):
        cfg = load_config(env={}, source_uri=f"{root}/src", checkpoint_uri=f"{root}/{name}/ckpt",
                          sink_uri=f"{root}/{name}/sink", clock_now="2027-01-01T00:00:00Z", epoch_seconds=60, **kw)
        return JobRunner(join_agg(), cfg, echo=lambda m: None)

    def state(r):
        out = {}
        for uid, hs in r.snapshot().metadata.operators.items():
            for h in hs:
                if h.file is not None:
                    t = pq.read_table(io.BytesIO(fio.read_bytes(h.file.uri)))
                    out.setdefault(f"{uid}/{h.name}", []).extend(
                        sorted(json.dumps(x, sort_keys=True, default=str) for x in t.to_pylist()))
        return {k: sorted(v) for k, v in out.items()}

    def sinks(r):
        return {t: sorted(json.dumps(x, sort_keys=True, default=str) for x in r.table(t).read().to_pylist())
                for t in r.job.sink_tables()}

    full = runner("full", parallelism=2)
    full.run()
    boot = runner("boot", parallelism=2)
    d = bootstrap(boot, epoch=T0 // E_US + 1)
    boot2 = runner("boot", parallelism=3)
    boot2.restore(d["savepoint"], parallelism=3, validate=False)
    boot2.run()
    print("RESULT " + json.dumps({
        "savepoint": d["savepoint"], "epoch_full": full.snapshot().metadata.epoch,
        "epoch_boot": boot2.snapshot().metadata.epoch, "same_sinks": sinks(full) == sinks(boot2),
        "same_state": state(full) == state(boot2), "rows": {t: len(v) for t, v in sinks(full).items()}}))


if __name__ == "__main__":
    main(sys.argv[1])
