"""Recovery datasets: the batch evaluation summarised on the executors, compared per key group with the
checkpoint, mismatching key groups drilled down row by row, conservation per object."""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.fileio import file_io_for
from pipeline.quality.collect_base import MAX_EXAMPLES, CollectorBase, records_frame
from pipeline.quality.keygroups import key_groups, xxhash64
from pipeline.quality.keygroups import key_groups as kgf
from pipeline.quality.rowdiff import row_diff
from pipeline.runtime.spark.dataflow import schema_ddl
from pipeline.runtime.spark.task_requests import counted_in_span

__all__ = ["RecoveryCollector"]


class RecoveryCollector(CollectorBase):
    """Recovery steps of the collector."""

    # -- recovery --------------------------------------------------------------------------------
    def recompute(self, plan) -> dict:
        """Run the batch plan (:mod:`pipeline.quality.recovery`) and summarise its rows like the real ones - on
        the executors; the driver gets the summaries only (the rows of a key group on demand, on failure)."""
        for obj in plan.columns:
            if obj not in self.objects.specs:
                raise ValueError(f"the batch evaluation of job {self.job.name!r} produces {obj}, which the job does "
                                 f"not have (objects: {sorted(self.objects.specs)})")
        rec = plan.materialize(self.objects.specs, self.mp)
        for k, v in rec.timings.items():
            self.out.timings[k] = self.out.timings.get(k, 0.0) + v
        return {"rec": rec, "per_kg": rec.per_kg, "per_group": rec.per_group,
                "rows": lambda obj, kgs: plan.rows(obj, kgs, self.mp, self.objects.specs[obj].key)}

    def recovery_datasets(self, exp: dict, files) -> None:
        """Over 80 lines: the recovery datasets from one pass over the recomputed objects (state, output, dead
        letters), each section commented."""
        rec = exp["rec"]
        a = self.actual_per_kg.rename(columns={"obj": "object"})
        e = exp["per_kg"].rename(columns={"obj": "object"})
        keep = ["object", "kg", "rows", "keys", "fp_num", "fp_ts", "fp_str"]
        a = a[keep] if len(a) else pd.DataFrame(columns=keep)
        e = e[keep] if len(e) else pd.DataFrame(columns=keep)
        objs = sorted(rec.objects)
        a = a[a["object"].isin(objs)]
        # keyless objects (an append sink of windows, a changelog): rows are compared, there is no key to count
        keyless = {o for o, sp in self.objects.specs.items() if sp.key is None}
        a = a.assign(keys=a["keys"].where(~a["object"].isin(keyless), 0))
        e = e.assign(keys=e["keys"].where(~e["object"].isin(keyless), 0))
        m = a.merge(e, on=["object", "kg"], how="outer", suffixes=("", "_exp"))
        for c in ("rows", "keys", "fp_num", "fp_ts", "fp_str"):
            m[c] = m[c].fillna(0).astype("int64")
            m[f"expected_{c}"] = m.pop(f"{c}_exp").fillna(0).astype("int64")
        m["missing_rows"] = 0
        m["extra_rows"] = 0
        m["orphan_rows"] = 0
        m = m.sort_values(["object", "kg"]).reset_index(drop=True)
        differs = np.zeros(len(m), dtype=bool)
        for c in ("rows", "keys", "fp_num", "fp_ts", "fp_str"):
            differs |= (m[c] != m[f"expected_{c}"]).to_numpy()
        bad = m[differs]
        examples_missing: list[dict] = []
        examples_extra: list[dict] = []
        if len(bad):
            with self.timer("recovery_drilldown"):
                for obj, grp in bad.groupby("object"):
                    grp = grp.assign(_d=(grp["rows"] - grp["expected_rows"]).abs()).sort_values("_d", ascending=False)
                    kgs = [int(k) for k in grp["kg"].head(self.drill_kgs)]
                    undrilled = [int(k) for k in grp["kg"].iloc[self.drill_kgs:]]
                    if undrilled:
                        m.loc[(m["object"] == obj) & m["kg"].isin(undrilled),
                              ["missing_rows", "extra_rows", "orphan_rows"]] = None
                    try:
                        actual = self.actual_rows(obj, set(kgs), files)
                    except Exception as ex:  # noqa: BLE001 - the summaries still fail; examples are a bonus
                        self.out.messages.append(f"could not read rows of {obj} for examples: {ex}")
                        m.loc[(m["object"] == obj) & m["kg"].isin(kgs),
                              ["missing_rows", "extra_rows", "orphan_rows"]] = None
                        continue
                    exp_table = exp["rows"](obj, set(kgs))       # the executors filter the key groups
                    spec = self.objects.specs[obj]
                    exp_key = (exp_table[spec.key] if spec.key is not None
                               else pa.nulls(exp_table.num_rows, pa.string()))
                    exp_kg = np.mod(xxhash64(exp_key), np.int64(self.mp))
                    for kg in kgs:
                        act_k = actual.filter(pc.equal(actual["__kg"], kg)).drop_columns(["__kg"]) if actual.num_rows \
                            else actual
                        exp_k = exp_table.filter(pa.array(exp_kg == kg))
                        d = row_diff(act_k, exp_k)
                        sel = (m["object"] == obj) & (m["kg"] == kg)
                        m.loc[sel, "missing_rows"] = d["missing"]
                        m.loc[sel, "extra_rows"] = d["extra"]
                        orphan = 0
                        fn = rec.orphans.get(obj)
                        if fn is not None and d["extra_table"] is not None and d["extra_table"].num_rows:
                            orphan = int(pc.sum(pc.cast(fn(d["extra_table"]), pa.int64())).as_py() or 0)
                        m.loc[sel, "orphan_rows"] = orphan
                        examples_missing += [{"object": obj, "kg": kg, **r} for r in d["missing_rows"]]
                        examples_extra += [{"object": obj, "kg": kg, **r} for r in d["extra_rows"]]
                        if d["error"]:
                            self.out.messages.append(f"{obj}: {d['error']}")
        cols = ["object", "kg", "rows", "expected_rows", "keys", "expected_keys", "fp_num", "expected_fp_num", "fp_ts",
                "expected_fp_ts", "fp_str", "expected_fp_str", "missing_rows", "extra_rows", "orphan_rows"]
        m = m[cols].astype(object)
        for c in ("missing_rows", "extra_rows", "orphan_rows"):
            m[c] = pd.Series([None if pd.isna(v) else int(v) for v in m[c]], index=m.index, dtype=object)
        self.out.datasets["recovery_key_groups"] = m.where(pd.notna(m), None)
        self.out.examples["recovery_missing"] = examples_missing[:MAX_EXAMPLES]
        self.out.examples["recovery_extra"] = examples_extra[:MAX_EXAMPLES]
        self.out.examples["recovery_diff"] = (examples_missing[:3] + examples_extra[:3])
        # conservation: every valid input row is in state or in the output, exactly once
        rows_of = ({o: int(g["rows"].sum()) for o, g in self.actual_per_kg.groupby("obj")}
                   if len(self.actual_per_kg) else {})
        cons = []
        for c in rec.conservation:
            in_state = sum(rows_of.get(o, 0) for o in c["state"])
            in_output = sum(rows_of.get(o, 0) for o in c["output"])
            cons.append({"source": c["source"], "input_rows": int(c["input_rows"]), "in_state": in_state,
                         "in_output": in_output, "accounted": in_state + in_output})
        self.out.datasets["recovery_conservation"] = records_frame(cons, ["source", "input_rows", "in_state", "in_output",
                                                                   "accounted"])
        self.out.examples["conservation"] = [c for c in cons if c["accounted"] != c["input_rows"]]
        self.out.messages += rec.messages
        self.out.figures["recomputed"] = rec.stats
        # objects the plan found undecidable only once it ran (keys repeated on a join's unique side)
        nc = self.out.figures.setdefault("not_checked", {})
        nc.update({o: why for o, why in rec.unchecked.items() if o not in nc})

    def actual_rows(self, obj: str, kgs: set[int], files) -> pa.Table:
        """The real rows of ``obj`` in key groups ``kgs`` (Spark reads and filters; only on failure)."""
        if obj in self.upsert_tables:
            t = self.upsert_tables[obj]
            spec = self.objects.specs[obj]
            kg = key_groups(t[spec.key], self.mp) if t.num_rows else np.zeros(0, np.int32)
            return t.append_column("__kg", pa.array(kg, pa.int32())).filter(pa.array(np.isin(kg, list(kgs))))
        uris = [u for _, o, u, *_ in files if o == obj]
        readable = [u for u in uris if self.data_file_records.get(u, {}).get("schema")]
        if not readable:
            return pa.table({"__kg": pa.array([], pa.int32())})
        import pyarrow.parquet as pq
        with self.fio(readable[0]).open_input(readable[0]) as f:
            schema = pq.read_schema(f)
        schema = pa.schema([f for f in schema if f.name != "_kg"]).append(pa.field("__kg", pa.int32()))
        key = self.objects.specs[obj].key
        mp = self.mp
        wanted = sorted(kgs)

        def task(batches):
            import pyarrow.parquet as pq2

            for b in batches:
                for uri in b.column(0).to_pylist():
                    try:
                        t = pq2.read_table(io.BytesIO(file_io_for(uri).read_bytes(uri)))
                    except Exception:  # noqa: BLE001 - unreadable files are reported by the file checks
                        continue
                    # a keyless object (an append sink of a dedup or of windows): every row in the key group of
                    # the null key, as the summaries and the expected rows have it
                    k = kgf(pc.cast(t[key], pa.string()) if key is not None else pa.nulls(t.num_rows, pa.string()), mp)
                    sel = np.isin(k, wanted)
                    if not sel.any():
                        continue
                    t = t.append_column("__kg", pa.array(k, pa.int32())).filter(pa.array(sel))
                    yield from t.select(schema.names).cast(schema).to_batches()

        if self.out.figures.get("engine") == "local":
            with ThreadPoolExecutor(max_workers=max(1, min(len(uris), 8))) as pool:
                parts = [b for bs in pool.map(lambda u: list(task(iter([pa.RecordBatch.from_pylist([{"uri": u}])]))),
                                              uris) for b in bs]
            return pa.Table.from_batches(parts, schema=schema) if parts else schema.empty_table()
        spark = self.runner.spark
        ddl = schema_ddl(schema)
        df = spark.createDataFrame(spark.sparkContext.parallelize([(u,) for u in uris], max(1, min(len(uris), 8))),
                                   "uri string").mapInArrow(counted_in_span(task), ddl)
        return df.toArrow()
