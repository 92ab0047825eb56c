"""Reference pages generated from the code, so they cannot drift (an MkDocs hook, and a module the tests import).

A page holds a marker line; at build time the hook replaces it with a table generated from the declarations:

* ``<!-- refgen:config -->``: every :class:`pipeline.config.PipelineConfig` field (key, type, default and the
  attribute docstring under the field), then every other environment variable, as declared in
  :data:`pipeline.settings.SETTINGS` (type, default, doc line), with the files that name it;
* ``<!-- refgen:cli -->``: every command, sub-command and flag of :func:`pipeline.cli.build_parser`.

Run ``python docs/hooks/refgen.py config|cli`` to print a table.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG_PY = REPO / "pipeline" / "config.py"
SETTINGS_PY = REPO / "pipeline" / "settings.py"

_NOT_SETTINGS = {"PIPELINE_X"}  # the docstring's "field x is read from PIPELINE_X"
_VAR = re.compile(r"\b(?:PIPELINE|EPOCHAL)_[A-Z0-9_]*[A-Z0-9]\b")
_SCANNED = ("pipeline", "dags", "plugins", "include")


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    key: str
    type: str
    default: str
    doc: str


def config_keys() -> list[ConfigKey]:
    """The fields of ``PipelineConfig`` in declaration order, with their attribute docstrings (read with ast)."""
    from pipeline import config as cfg_mod

    tree = ast.parse(CONFIG_PY.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PipelineConfig")
    docs: dict[str, str] = {}
    types: dict[str, str] = {}
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            types[name] = ast.unparse(node.annotation)
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[name] = " ".join(nxt.value.value.split())
    home = cfg_mod._DEFAULT_ROOT.as_uri()
    out = []
    for f in dataclasses.fields(cfg_mod.PipelineConfig):
        default: Any = f.default
        if hasattr(default, "value"):  # an enum
            default = default.value
        if isinstance(default, bool):
            shown = "true" if default else "false"
        elif isinstance(default, str):
            shown = default.replace(home, "file://$EPOCHAL_HOME") if default else "(empty)"
        else:
            shown = str(default)
        out.append(ConfigKey(f"PIPELINE_{f.name.upper()}", types.get(f.name, str(f.type)), shown,
                             docs.get(f.name, "")))
    return out


def other_settings() -> dict[str, list[str]]:
    """Variables the package's sources name that are not PipelineConfig keys -> the files that name them."""
    from pipeline.config import CONFIG_KEYS

    found: dict[str, set[str]] = {}
    for top in _SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if path == SETTINGS_PY:  # the declarations themselves
                continue
            for var in set(_VAR.findall(path.read_text())):
                if var not in CONFIG_KEYS and var not in _NOT_SETTINGS:
                    found.setdefault(var, set()).add(str(path.relative_to(REPO)))
    return {k: sorted(v) for k, v in sorted(found.items())}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_markdown() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in config_keys():
        lines.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {_cell(k.doc)} |")
    from pipeline.settings import SETTINGS

    named = other_settings()
    titles = {"driver": "Driver and executors", "executors": "Executors (state stores and caches)",
              "airflow": "Airflow deployment", "internal": "Tests, benchmarks and fault injection (internal)",
              "provided": "Set by AWS, Spark, Airflow or the OS (read by Epochal)"}
    lines += ["", "### Other environment variables", "",
              "Declared in `pipeline/settings.py` (the only module besides `pipeline/config.py` that reads the "
              "environment) and read where they are used.", ""]
    for scope, title in titles.items():
        lines += [f"#### {title}", "", "| variable | type | default | meaning | named in |", "|---|---|---|---|---|"]
        for s in sorted((s for s in SETTINGS.values() if s.scope == scope), key=lambda s: s.name):
            files = named.get(s.name, [])
            where = ", ".join(f"`{f}`" for f in files[:3]) + (" ..." if len(files) > 3 else "")
            default = "(unset)" if s.default is None else f"`{_cell(s.default)}`"
            lines.append(f"| `{s.name}` | `{s.type}` | {default} | {_cell(s.doc)} | {where} |")
        lines.append("")
    return "\n".join(lines)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _flag(action: argparse.Action) -> str:
    opt = " / ".join(action.option_strings)
    if action.nargs == 0:
        return opt
    metavar = action.metavar or action.dest.upper()
    return f"{opt} {metavar}"


def cli_markdown() -> str:
    from pipeline.cli import build_parser

    root = build_parser()
    out: list[str] = []

    def emit(prefix: str, parent: argparse.ArgumentParser) -> None:
        for name, p in _subparsers(parent).items():
            full = f"{prefix} {name}".strip()
            children = _subparsers(p)
            if children:
                emit(full, p)
                continue
            out.append(f"### `{full}`\n\n{_help_of(parent, name)}\n")
            out.append(f"```text\n{p.format_usage().strip()}\n```\n")
            out.append("| flag | required | default | meaning |\n|---|---|---|---|")
            for a in p._actions:
                if isinstance(a, argparse._HelpAction) or not a.option_strings:
                    continue
                default = "" if a.default in (None, False, argparse.SUPPRESS) else f"`{a.default}`"
                out.append(f"| `{_cell(_flag(a))}` | {'yes' if a.required else ''} | {default} | "
                           f"{_cell(a.help or '')} |")
            out.append("")

    emit("", root)
    return "\n".join(out)


GENERATORS = {"config": config_markdown, "cli": cli_markdown}
_MARKER = re.compile(r"^<!-- refgen:(\w+) -->$", re.M)


def expand(markdown: str) -> str:
    return _MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: replace the markers of a page with the generated tables."""
    return expand(markdown) if "<!-- refgen:" in markdown else markdown


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
