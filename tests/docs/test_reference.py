"""The generated reference pages cannot drift: every config key has a doc line (the attribute docstring under its
field in pipeline/config.py), every other variable the package reads is listed, and every CLI flag has a help
text (docs/hooks/refgen.py renders them)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _refgen():
    spec = importlib.util.spec_from_file_location("refgen", REPO / "docs" / "hooks" / "refgen.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["refgen"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_config_key_is_documented_in_its_declaration():
    from pipeline.config import CONFIG_KEYS

    keys = _refgen().config_keys()
    assert [k.key for k in keys] == list(CONFIG_KEYS)
    undocumented = [k.key for k in keys if len(k.doc) < 10]
    assert not undocumented, f"add a docstring under these fields of PipelineConfig: {undocumented}"
    table = _refgen().config_markdown()
    assert "`PIPELINE_MAX_TASK_BYTES_PER_ROUND` | `int` | `134217728`" in table


def test_every_other_variable_the_package_reads_is_documented():
    refgen = _refgen()
    found = refgen.other_settings()
    assert "PIPELINE_STATE_STORE_DIR" in found and "PIPELINE_EPOCH_SECONDS" not in found
    from pipeline.settings import SETTINGS

    missing = sorted(set(found) - set(SETTINGS))
    assert not missing, f"declare these variables in pipeline/settings.py: {missing}"
    md = refgen.config_markdown()
    assert all(f"`{name}`" in md for name in SETTINGS)


def test_every_cli_command_and_flag_is_in_the_reference_with_a_help_text():
    import argparse

    from pipeline.cli import build_parser

    md = _refgen().cli_markdown()
    for cmd in ("run", "checkpoints list", "checkpoints show", "savepoint", "restore", "validate", "export", "batch",
                "bootstrap", "state"):
        assert f"### `{cmd}`" in md
    root = build_parser()
    without_help = []

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
            elif a.option_strings and not isinstance(a, argparse._HelpAction):
                assert a.option_strings[0] in md
                if not a.help:
                    without_help.append(f"{prefix} {a.option_strings[0]}")

    walk(root, "")
    assert not without_help, f"give these flags a help= text in pipeline/cli.py: {without_help}"


def test_every_test_switch_is_in_the_readme_profile_table():
    """An ``EPOCHAL_*`` variable that only the tests read is a test switch (an opt-in profile or a knob of one):
    the README's profile table names each, so no long profile hides in a test file."""
    import re

    def names(root: str) -> set[str]:
        found: set[str] = set()
        for p in (REPO / root).rglob("*"):
            if p.suffix in (".py", ".sh", ".yaml", ".yml", ".cfg"):
                found |= set(re.findall(r"EPOCHAL_[A-Z0-9_]*[A-Z0-9]", p.read_text()))
        return found

    product = set().union(*(names(d) for d in ("pipeline", "dags", "plugins", "include", "scripts")))
    product |= set(re.findall(r"EPOCHAL_[A-Z0-9_]*[A-Z0-9]", (REPO / "docker-compose.yaml").read_text()))
    switches = names("tests") - product
    table = (REPO / "README.md").read_text().split("| profile | switch |", 1)[1].split("\n\n", 1)[0]
    missing = sorted(s for s in switches if s not in table)
    assert not missing, f"add these test switches to the README's profile table: {missing}"


def test_every_public_stream_method_is_in_the_job_api_reference():
    """A new operator's method (``Stream.top_n``, ...) is listed in docs/reference/job-api.md, whose members list
    mkdocstrings renders (a method left out of it is missing from the site without any warning)."""
    import inspect
    import re

    from pipeline.job import Stream

    text = (REPO / "docs" / "reference" / "job-api.md").read_text()
    block = text.split("::: pipeline.job.Stream", 1)[1].split("]", 1)[0]
    listed = set(re.findall(r"[a-z_]+", block.split("[", 1)[1]))
    public = {n for n, _ in inspect.getmembers(Stream, inspect.isfunction) if not n.startswith("_")}
    assert public - listed == set(), f"add these Stream methods to docs/reference/job-api.md: {public - listed}"


def test_every_job_source_parameter_is_in_its_docstring():
    """The job API reference renders ``Job.source``'s docstring: every parameter (``table=``, ``ingest_time=``, ...) is
    named there, and the lake-source how-to is in the site's navigation."""
    import inspect

    from pipeline.job import Job

    args = (inspect.getdoc(Job.source) or "").split("Args:", 1)[-1]
    params = [p for p in inspect.signature(Job.source).parameters if p != "self"]
    missing = [p for p in params if f"\n    {p}: " not in args]
    assert missing == [], f"document these Job.source parameters in its docstring: {missing}"
    assert "how-to/lake-sources.md" in (REPO / "mkdocs.yml").read_text()

