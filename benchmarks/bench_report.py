"""The benchmark's report: the systems table, Epochal's checkpoint figures, and the block written into
docs/performance.md between markers (one per dataset size)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench_machine import say

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_BEGIN = "<!-- bench:begin orders={orders} -->"
DOC_END = "<!-- bench:end orders={orders} -->"


def default_epochs_per_round() -> int:
    """``PIPELINE_MAX_EPOCHS_PER_ROUND``'s default (pipeline/config.py), for a run that does not set it."""
    from dataclasses import fields

    from pipeline.config import PipelineConfig
    return int(next(f.default for f in fields(PipelineConfig) if f.name == "max_epochs_per_round"))  # type: ignore[call-overload]


# ----------------------------------------------------------------------------------------- report
def table_lines(results: list[dict], events: int) -> list[str]:
    one = next((r for r in results if r["system"].startswith("one-shot")), None)
    one_eps = events / one["job_s"] if one else None
    hdr = (f"{'system':<28}{'events':>10}{'session s':>10}{'job s':>9}{'events/s':>10}{'vs one-shot':>12}"
           f"{'proc s':>8}{'cpu s':>7}{'foreign%':>9}  correct")
    lines = [hdr]
    for r in results:
        eps = events / r["job_s"]
        ratio = f"{eps / one_eps:.2f}x" if one_eps else "-"
        lines.append(f"{r['system']:<28}{events:>10}{(r.get('session_s') or 0):>10.1f}{r['job_s']:>9.1f}{eps:>10.0f}"
                     f"{ratio:>12}{r['proc_s']:>8.1f}{r['own_cpu_s']:>7.0f}{r['foreign_cpu_pct']:>9.1f}  "
                     f"{'yes' if r['correct'] else 'NO'}" + ("  (disturbed)" if r.get("disturbed") else ""))
    return lines


def epochal_lines(r: dict) -> list[str]:
    spark_rounds = r.get("spark_rounds") or r["rounds"]
    k = os.environ.get("PIPELINE_MAX_EPOCHS_PER_ROUND") or str(default_epochs_per_round())
    lines = [f"{r['system']}: {r['checkpoints']} checkpoints in {spark_rounds} Spark rounds "
             f"(PIPELINE_MAX_EPOCHS_PER_ROUND={k}); job {r['job_s']:.1f}s = rounds "
             f"{r['rounds_s']:.1f}s + planning/restore/cleanup between rounds {r['job_s'] - r['rounds_s']:.1f}s",
             f"  checkpoint finalize (acks + _metadata + sink commits + retention): {r['checkpoint_finalize_s']:.2f}s"
             f" = {100 * (r['checkpoint_overhead'] or 0):.1f}% of round time"]
    if r.get("checkpointing_share") is not None:
        lines.append(f"  state snapshot writes in the tasks (per operator the slowest subtask, summed; sink output "
                     f"staging not included): {r['snapshot_s']:.2f}s; checkpointing (snapshots + finalize) = "
                     f"{100 * r['checkpointing_share']:.1f}% of round time (target <= 10%)")
    if r.get("finalize_per_checkpoint_ms") is not None:
        lines.append(f"  sinks: format {r.get('sink_format')}; finalize (incl. sink commits) per checkpoint "
                     f"{r['finalize_per_checkpoint_ms']:.0f} ms; data files per table after the run: "
                     + (", ".join(f"{t} {n}" for t, n in (r.get("sink_files") or {}).items()) or "n/a (S3)"))
    d = r["round_durations_s"]
    if d:
        rest = sorted(d[1:]) or d
        lines.append(f"  per checkpoint (a tagged round's time is on its first checkpoint): first {d[0]:.2f}s "
                     f"(Python workers start), then median {rest[len(rest) // 2]:.2f}s, "
                     f"max {max(rest):.2f}s; state after the last epoch {r['state_bytes_last'] / 1e6:.1f} MB")
    kinds = r.get("cpu_by_kind_s")
    if kinds:
        lines.append("  CPU by process: " + ", ".join(f"{k} {v:.0f}s" for k, v in sorted(kinds.items())))
    return lines


def write_markdown(a: argparse.Namespace, doc: dict, lines: list[str], ep_lines: list[str]) -> None:
    path = os.path.join(REPO, "docs", "performance.md")
    begin, end = DOC_BEGIN.format(orders=a.orders), DOC_END.format(orders=a.orders)
    ev = doc["events"]
    one = next((r for r in doc["results"] if r["system"].startswith("one-shot")), None)
    md = [begin, f"### {doc['orders']:,} orders, {ev:,} events ({doc['date']})", "",
          f"`{doc['command']}` on {doc['machine']}; data on {doc['storage']}, {a.epochs} epochs x "
          f"{a.partitions} partitions per source. `job s` excludes JVM/session start; `vs one-shot` is the ratio "
          "of events/s; `foreign%` is CPU taken by other processes during the run (share of all cores).", "",
          "| system | events | session s | job s | events/s | vs one-shot | process s | CPU s | foreign % | correct |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["results"]:
        eps = ev / r["job_s"]
        ratio = f"{eps / (ev / one['job_s']):.2f}x" if one else "-"
        md.append(f"| {r['system']}{' (disturbed)' if r.get('disturbed') else ''} | {ev:,} | "
                  f"{(r.get('session_s') or 0):.1f} | {r['job_s']:.1f} | {eps:,.0f} | {ratio} | {r['proc_s']:.1f} | "
                  f"{r['own_cpu_s']:.0f} | {r['foreign_cpu_pct']:.1f} | {'yes' if r['correct'] else 'NO'} |")
    md += [""] + [f"- {l.strip()}" for l in ep_lines] + [""]
    for n in doc.get("notes", []):
        md.append(f"- {n}")
    md += ["", end]
    block = "\n".join(md)
    text = Path(path).read_text() if os.path.exists(path) else (
        "# Performance\n\nMeasured with `scripts/bench.sh` (see `benchmarks/throughput.py`). Regenerated blocks "
        "below are written by the benchmark; everything else is by hand.\n\n## Measured\n\n")
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        marker = "## Measured\n"
        if marker in text:
            i = text.index(marker) + len(marker)
            text = text[:i] + "\n" + block + "\n" + text[i:]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)
    say(f"wrote {os.path.relpath(path, REPO)}")
