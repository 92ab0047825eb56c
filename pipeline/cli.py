"""Command line: ``python -m pipeline <command>`` / ``epochal <command>``.

Exit codes: 0 success, 2 bad usage or configuration, any other non-zero value is a failure. Every
command accepts ``--json`` for machine-readable output and ``--config FILE`` (YAML with the same
``PIPELINE_*`` keys as the environment).

Lazy imports: each command imports the modules it needs when it runs, so ``epochal --help`` and the light
commands do not import pandas, the batch plan and the quality package (about 0.3 s and 450 modules more).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Callable, NoReturn, Sequence

from pipeline.exceptions import ConfigError, EpochalError

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # bad usage -> exit code 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _common(p: argparse.ArgumentParser, job: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", metavar="FILE", help="YAML file with PIPELINE_* keys")
    if job:
        p.add_argument("--job", required=True, help="job name (e.g. orders_payments) or module:function")


def build_parser() -> argparse.ArgumentParser:
    """Over 80 lines: one argparse declaration per subcommand, flat so `--help` and the CLI reference read in the same
    order."""
    ap = _Parser(prog="epochal", description="Epochal: exactly-once epochs on Spark with checkpoints on S3.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="resume from the latest checkpoint and complete up to N epochs")
    _common(p)
    p.add_argument("--epochs", type=int, default=None, help="epochs to complete (default: all available)")
    p.add_argument("--until-epoch", type=int, default=None, help="complete every epoch up to this one")
    p.add_argument("--parallelism", type=int, default=None,
                   help="operator subtasks from this run on (default: the checkpoint's, else PIPELINE_PARALLELISM)")
    p.add_argument("--follow", action="store_true",
                   help="keep running: complete each epoch as soon as its barrier rule allows (Spark, workers and "
                        "state stay warm), one line per checkpoint with its latency; SIGTERM or Ctrl-C stops after "
                        "the running checkpoint (docs/how-to/follow.md)")
    p.add_argument("--poll-seconds", type=float, default=None, metavar="S",
                   help="with --follow: how often to list the sources for new files while waiting "
                        "(default: a tenth of the epoch, between 0.5 and 10 s)")
    p.add_argument("--max-idle-seconds", type=float, default=None, metavar="S",
                   help="with --follow: stop (exit 0) after this long without a completed checkpoint")
    p.add_argument("--stop-with-savepoint", action="store_true",
                   help="with --follow: when stopping (signal, --max-idle-seconds, --epochs, --until-epoch), take "
                        "an aligned savepoint of the last checkpoint first and print its location")
    p.add_argument("--target", default=None,
                   help="with --stop-with-savepoint: savepoint directory URI (default <job>/savepoints/)")

    cp = sub.add_parser("checkpoints", help="list or inspect checkpoints")
    csub = cp.add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = csub.add_parser("list", help="completed checkpoints and savepoints")
    _common(p)
    p = csub.add_parser("show", help="one checkpoint in detail")
    _common(p)
    p.add_argument("--id", required=True, help="checkpoint id (or a savepoint URI)")

    p = sub.add_parser("savepoint", help="take an aligned, self-contained savepoint")
    _common(p)
    p.add_argument("--target", default=None, help="savepoint directory URI (default <job>/savepoints/)")

    p = sub.add_parser("restore", help="restore the job from a checkpoint id or a savepoint URI")
    _common(p)
    p.add_argument("--from", dest="from_", required=True, metavar="ID|URI",
                   help="a retained checkpoint id or a savepoint URI")
    p.add_argument("--parallelism", type=int, default=None,
                   help="operator subtasks after the restore (key groups are redistributed)")
    p.add_argument("--allow-non-restored-state", action="store_true",
                   help="restore even if the snapshot has state of operators the job no longer has")
    p.add_argument("--validate", choices=("full", "cheap", "none"), default=None,
                   help="what to check after the restore: full (every suite, the comparison with the batch meaning "
                        "over the source prefix included; about one Spark batch over the prefix), cheap (the restored "
                        "files, lineage, commits, state and sink keys: no source read) or none. Default: "
                        "EPOCHAL_RESTORE_VALIDATE, else full")

    p = sub.add_parser("validate", help="run the Great Expectations suites; non-zero exit on failure")
    _common(p)
    p.add_argument("--checkpoint", default=None, help="checkpoint id or savepoint URI (default: latest)")
    p.add_argument("--replay", action=argparse.BooleanOptionalAction, default=None,
                   help="determinism under replay of process operators: restore checkpoint n-1 in a scratch "
                        "location, re-run epoch n, compare (default: on for jobs with process operators)")

    p = sub.add_parser("export", help="write the committed rows of a sink table as Parquet")
    _common(p)
    p.add_argument("--table", required=True, help="sink table name")
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (a path, file:// or s3://)")

    p = sub.add_parser("batch", help="evaluate the job as one Spark batch query over a checkpoint's source prefix "
                       "and write every sink table and operator state it implies as Parquet")
    _common(p)
    p.add_argument("--checkpoint", default=None, metavar="ID|URI", help="checkpoint id or savepoint URI "
                   "(default: the latest completed checkpoint)")
    p.add_argument("--to", required=True, metavar="DIR", help="local output directory")

    p = sub.add_parser("bootstrap", help="compute a new job's state and output as of a barrier with one Spark batch "
                       "job and write it as a savepoint (sink output committed); then `restore --from` it")
    _common(p)
    p.add_argument("--epoch", type=int, default=None, help="barrier of this epoch (default: the newest complete one)")
    p.add_argument("--target", default=None, help="savepoint directory URI (default <job>/savepoints/)")
    p.add_argument("--parallelism", type=int, default=None, help="subtasks the savepoint's state is written for")

    p = sub.add_parser("state", help="write one operator's state of a checkpoint as Parquet")
    _common(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint id or savepoint URI")
    p.add_argument("--operator", required=True, help="operator uid")
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (a path, file:// or s3://)")
    return ap


def _print(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        print(human(data))


def _runner(args: argparse.Namespace, **overrides: Any):
    from pipeline.config import load_config
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(args.config, **overrides)
    echo = (lambda m: print(m, file=sys.stderr)) if args.json else (lambda m: print(m, file=sys.stderr))
    return JobRunner(get_job(args.job), cfg, echo=echo)


def _cmd_run(args: argparse.Namespace) -> int:
    from pipeline.inputs import check_parallelism
    if args.epochs is not None and args.epochs < 0:
        raise ConfigError("--epochs must be >= 0")
    parallelism = check_parallelism(args.parallelism)  # --parallelism 0 used to run nothing and exit 0
    if args.follow:
        return _follow(args, parallelism)
    for flag in ("poll_seconds", "max_idle_seconds", "target"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} needs --follow")
    if args.stop_with_savepoint:
        raise ConfigError("--stop-with-savepoint needs --follow")
    r = _runner(args)
    rep = r.run(args.epochs, until_epoch=args.until_epoch, parallelism=parallelism)
    d = rep.to_dict()

    def human(d: dict) -> str:
        start = (f"restored from checkpoint {d['restored_from']}" if d["restored_from"] is not None
                 else "started fresh (no checkpoint before)")
        lines = [f"job {d['job']}: {start}; completed checkpoints "
                 f"{d['checkpoints_completed']} (epochs {d['epochs_completed']}); records {d['records']}"]
        lines += [f"  {m}" for m in d["messages"]]
        return "\n".join(lines)
    _print(args, d, human)
    return 0


def _follow(args: argparse.Namespace, parallelism: int | None) -> int:
    from pipeline.inputs import check_savepoint_target
    from pipeline.runtime.driver.follow import Follower, FollowOptions, StopRequest
    # usage errors before any side effect (exit 2)
    opts = FollowOptions(epochs=args.epochs, until_epoch=args.until_epoch, parallelism=parallelism,
                         poll_seconds=args.poll_seconds, max_idle_seconds=args.max_idle_seconds,
                         stop_with_savepoint=args.stop_with_savepoint,
                         savepoint_target=check_savepoint_target(args.target))
    stop = StopRequest()
    stop.install()  # from here on a signal is a graceful stop (the follower installs it again after Spark starts)
    try:
        rep = Follower(_runner(args), opts, stop).run()
    except KeyboardInterrupt as e:  # a second signal: stopped at once (the next run resumes)
        print(f"epochal: follow of job {args.job} stopped at once ({e or 'interrupted'}); the next run resumes "
              "from the latest completed checkpoint", file=sys.stderr)
        return 130
    finally:
        stop.close()
    _print(args, rep.to_dict(), lambda d: rep.summary())
    return 0


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    from pipeline.checkpoint import history as insp
    r = _runner(args)
    if args.action == "list":
        rows = insp.list_checkpoints(r)
        _print(args, rows, insp.format_list)
    else:
        d = insp.show_checkpoint(r, args.id)
        _print(args, d, insp.format_show)
    return 0


def _cmd_savepoint(args: argparse.Namespace) -> int:
    from pipeline.inputs import check_savepoint_target
    target = check_savepoint_target(args.target)  # before any side effect (no id claimed, nothing aborted)
    r = _runner(args)
    loc = r.savepoint(target)
    _print(args, {"savepoint": loc}, lambda d: d["savepoint"])
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from pipeline.inputs import check_parallelism, check_snapshot_ref
    from pipeline.runtime.driver.validation import restore_validation
    from_, parallelism = check_snapshot_ref(args.from_), check_parallelism(args.parallelism)
    level = restore_validation(args.validate)
    r = _runner(args)
    d = r.restore(from_, parallelism=parallelism, allow_non_restored_state=args.allow_non_restored_state,
                  validate=level)
    _print(args, d, lambda d: f"restored {d['job']} from {d['from']} as checkpoint {d['checkpoint_id']}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.batch.jvm import use_batch_jvm_options
    from pipeline.quality import validate_job
    use_batch_jvm_options()   # a short-lived process: JIT/GC options for the batch plan it compares with (docs/batch.md)
    r = _runner(args)
    result = validate_job(r, args.checkpoint, replay=args.replay)
    _print(args, result.to_dict(), lambda d: result.summary())
    return 0 if result.success else 1


def _cmd_export(args: argparse.Namespace) -> int:
    r = _runner(args)
    d = r.export(args.table, args.to)
    _print(args, d, lambda d: f"exported {d['rows']} committed rows of {d['table']} to {d['to']}")
    return 0


def _cmd_batch(args: argparse.Namespace) -> int:
    from pipeline.batch import write_batch
    from pipeline.batch.jvm import use_batch_jvm_options
    use_batch_jvm_options()   # a short-lived process: JIT/GC options for the one large plan (docs/batch.md)
    r = _runner(args)
    d = write_batch(r, args.checkpoint, args.to)

    def human(d: dict) -> str:
        lines = [f"batch evaluation of checkpoint {d['checkpoint']} (epoch {d['epoch']}) written to {d['to']}"]
        lines += [f"  {obj}: {n} rows" for obj, n in sorted(d["objects"].items())]
        lines += [f"  NOT MODELLED {obj}: {why}" for obj, why in sorted(d["unchecked"].items())]
        return "\n".join(lines + [f"  {m}" for m in d["messages"]])

    _print(args, d, human)
    return 0


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    from pipeline.batch.bootstrap.savepoint import bootstrap
    from pipeline.inputs import check_parallelism, check_savepoint_target
    # before any side effect: usage errors exit 2 without touching storage
    target, parallelism = check_savepoint_target(args.target), check_parallelism(args.parallelism)
    if args.epoch is not None and args.epoch < 0:
        raise ConfigError(f"--epoch {args.epoch}: must be >= 0")
    from pipeline.batch.jvm import use_batch_jvm_options
    use_batch_jvm_options()   # a short-lived process: JIT/GC options for the one large plan (docs/batch.md)
    r = _runner(args)
    d = bootstrap(r, epoch=args.epoch, target=target, parallelism=parallelism)

    def human(d: dict) -> str:
        lines = [f"bootstrapped {d['job']} at epoch {d['epoch']} in {d['seconds']} s: savepoint {d['savepoint_id']} "
                 f"at {d['savepoint']}", f"  restore with: epochal restore --job {d['job']} --from {d['savepoint']}"]
        return "\n".join(lines + [f"  {obj}: {n} rows" for obj, n in sorted(d["objects"].items())])

    _print(args, d, human)
    return 0


def _cmd_state(args: argparse.Namespace) -> int:
    r = _runner(args)
    d = r.export_state(args.checkpoint, args.operator, args.to)
    _print(args, d, lambda d: f"wrote {d['rows']} state rows of {d['operator']} ({d['checkpoint']}) to {d['to']}")
    return 0


_COMMANDS = {"run": _cmd_run, "checkpoints": _cmd_checkpoints, "savepoint": _cmd_savepoint,
             "restore": _cmd_restore, "validate": _cmd_validate, "export": _cmd_export, "state": _cmd_state,
             "batch": _cmd_batch, "bootstrap": _cmd_bootstrap}


# commands that log what they do every 10 s and end with a one-line summary with the time (docs/quality.md)
LONG_COMMANDS = frozenset({"validate", "restore", "savepoint", "bootstrap", "batch", "export"})


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.command in LONG_COMMANDS:
            from pipeline.runtime.driver.progress import Heartbeat
            with Heartbeat(args.command, lambda m: print(m, file=sys.stderr, flush=True)):
                return _COMMANDS[args.command](args)
        return _COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"epochal: configuration error: {e}", file=sys.stderr)
        return 2
    except EpochalError as e:
        print(f"epochal: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code if e.exit_code not in (0, 2) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
