"""Exactly-once sinks: transactions, committed tables with lineage, two-phase commit.

    transaction  TransactionState, SinkTransaction (guarded state machine)
    table        CommitEntry, CommittedTable (commit log, lineage, readers, garbage)
    two_phase    TwoPhaseCommitSink (begin / pre_commit / commit / abort / recover_and_commit)
"""
from __future__ import annotations

from pipeline.sink.table import CommitEntry, CommittedTable
from pipeline.sink.transaction import SinkTransaction, TransactionState
from pipeline.sink.two_phase import TwoPhaseCommitSink

__all__ = ["CommitEntry", "CommittedTable", "SinkTransaction", "TransactionState", "TwoPhaseCommitSink"]
