"""Dead-letter keys: where bad input and late or violating records go.

::

    <dead-letter root>                                  # PIPELINE_DEAD_LETTER_URI, or <checkpoint root>/_dead_letter
      <job>/<source>/partition=<p>/<seq>-<row>.jsonl    # source bad records (pipeline.source.reader.dead_letter_uri)
      <job>/operator=<uid>/epoch-<m>/chk-<id>/<file>    # an operator's, per epoch and checkpoint attempt

(why the operator's are per attempt, and how they are swept: :mod:`pipeline.runtime.operators.dead_letters`).
"""
from __future__ import annotations

import re

__all__ = ["DEFAULT_DEAD_LETTER_DIR", "default_dead_letter_root", "dead_letter_name", "operator_dead_letter_prefix",
           "epoch_dir_name", "is_epoch_dir", "epoch_dead_letter_prefix", "attempt_dead_letter_dir", "ATTEMPT_DIR"]

#: the dead-letter root's name under the checkpoint root when none is configured
DEFAULT_DEAD_LETTER_DIR = "_dead_letter"

_EPOCH = "epoch-"

#: ``/epoch-<m>/chk-<id>/`` in an operator dead-letter file's URI (groups: epoch, checkpoint id)
ATTEMPT_DIR = re.compile(r"/epoch-(\d+)/chk-(\d+)/")


def default_dead_letter_root(checkpoint_root: str) -> str:
    """``<checkpoint root>/_dead_letter``: the dead-letter root when none is configured."""
    return f"{checkpoint_root.rstrip('/')}/{DEFAULT_DEAD_LETTER_DIR}"


def dead_letter_name(uid: str) -> str:
    """The stats key (``checkpoints show`` dead letters) of an operator's dead letters."""
    return f"operator={uid}"


def operator_dead_letter_prefix(dead_letter_root: str, job: str, uid: str) -> str:
    """``<root>/<job>/operator=<uid>`` (``operator=`` cannot clash with a source name)."""
    return f"{dead_letter_root.rstrip('/')}/{job}/{dead_letter_name(uid)}"


def epoch_dir_name(epoch: int) -> str:
    """``epoch-<m>``: an epoch's directory of operator dead letters."""
    return f"{_EPOCH}{int(epoch)}"


def is_epoch_dir(name: str) -> bool:
    return name.startswith(_EPOCH)


def epoch_dead_letter_prefix(dead_letter_root: str, job: str, uid: str, epoch: int) -> str:
    return f"{operator_dead_letter_prefix(dead_letter_root, job, uid)}/{epoch_dir_name(epoch)}"


def attempt_dead_letter_dir(operator_prefix: str, epoch: int, checkpoint: str) -> str:
    """The directory of one checkpoint attempt's dead letters (``operator_prefix``: what
    :func:`operator_dead_letter_prefix` gives; ``checkpoint``: the attempt's ``chk-<id>`` name)."""
    return f"{operator_prefix.rstrip('/')}/{epoch_dir_name(epoch)}/{checkpoint}"
