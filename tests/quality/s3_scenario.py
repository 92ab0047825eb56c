"""Run by test_quality_s3.py in a fresh process (so that Spark starts with the moto AWS_* environment).

Usage: python s3_scenario.py s3://bucket/prefix  -> prints one JSON line with the outcomes.
"""
from __future__ import annotations

import json
import logging
import sys


def main(root: str) -> dict:
    import boto3

    from pipeline.config import load_config
    from pipeline.demo.generate import generate
    from pipeline.jobs import get_job
    from pipeline.quality import validate_job
    from pipeline.runtime.driver.runner import JobRunner
    logging.basicConfig(level=logging.WARNING)
    generate(f"{root}/src", epochs=2, partitions=2, orders_per_epoch=200, seed=3)
    cfg = load_config(env={}, source_uri=f"{root}/src", checkpoint_uri=f"{root}/ckpt", sink_uri=f"{root}/sink",
                      clock_now="2026-06-01T00:00:00Z")
    runner = JobRunner(get_job("orders_payments"), cfg, echo=lambda m: None)
    runner.run()
    good = validate_job(runner, None, build_docs=False)
    # break it on S3 directly: delete one state object of the newest checkpoint
    bucket, _, prefix = root[len("s3://"):].partition("/")
    s3 = boto3.client("s3")
    md_key = f"{prefix}/ckpt/orders_payments/checkpoints/chk-{good.checkpoint_id}/_metadata"
    md = json.loads(s3.get_object(Bucket=bucket, Key=md_key)["Body"].read())
    handle = next(h for h in md["operators"]["paid_orders_join"] if h["file"])
    victim = handle["file"]["uri"]
    s3.delete_object(Bucket=bucket, Key=victim[len(f"s3://{bucket}/"):])
    bad = validate_job(runner, None, build_docs=False)
    summary_key = f"{prefix}/ckpt/orders_payments/validation/chk-{good.checkpoint_id}/summary.json"
    stored = json.loads(s3.get_object(Bucket=bucket, Key=summary_key)["Body"].read())
    return {"good": good.success, "good_summary": good.summary(), "evaluated": good.evaluated,
            "bad": bad.success, "bad_failed": sorted({s.suite for s in bad.suites if not s.success}),
            "bad_summary": bad.summary(), "victim": victim, "stored_success": stored["success"],
            "result_uri": good.result_uri}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])))
