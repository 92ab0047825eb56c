"""SinkTransaction: the guarded 2PC state machine."""
from __future__ import annotations

import itertools

import pytest

from pipeline.checkpoint.handles import FileHandle
from pipeline.exceptions import SinkError, TransactionStateError
from pipeline.sink.transaction import SinkTransaction
from pipeline.sink.transaction import TransactionState as S

pytestmark = pytest.mark.unit

STAGING = "s3://b/sink/job/t/data/txn-7"
F = FileHandle(STAGING + "/part-00000.parquet", 1, 10, "0" * 64)

ACTIONS = {
    "pre_commit": lambda t: t.pre_commit([F]),
    "commit": lambda t: t.commit(),
    "abort": lambda t: t.abort(),
}
# (state reached by a path, action) -> resulting state; anything absent is illegal
LEGAL = {(S.OPEN, "pre_commit"): S.PRE_COMMITTED, (S.OPEN, "abort"): S.ABORTED,
         (S.PRE_COMMITTED, "commit"): S.COMMITTED, (S.PRE_COMMITTED, "abort"): S.ABORTED}
PATHS = {S.OPEN: [], S.PRE_COMMITTED: ["pre_commit"], S.COMMITTED: ["pre_commit", "commit"],
         S.ABORTED: ["abort"]}


def txn_in(state: S) -> SinkTransaction:
    t = SinkTransaction("t", 7, STAGING, parent_id=6)
    for a in PATHS[state]:
        ACTIONS[a](t)
    assert t.state is state
    return t


@pytest.mark.parametrize("state,action", list(itertools.product(list(S), list(ACTIONS))))
def test_every_transition(state, action):
    t = txn_in(state)
    if (state, action) in LEGAL:
        ACTIONS[action](t)
        assert t.state is LEGAL[(state, action)]
    else:
        with pytest.raises(TransactionStateError) as err:
            ACTIONS[action](t)
        assert "t/txn-7" in str(err.value) and state.name in str(err.value)
        assert t.state is state  # unchanged


def test_files_and_flags():
    t = SinkTransaction("t", 7, STAGING + "/")
    assert t.staging_uri == STAGING and t.txn_id == "t/txn-7"
    t.add_files([F])
    t.pre_commit([], full=True)
    assert t.files == (F,) and t.full
    with pytest.raises(TransactionStateError, match="cannot add files in state PRE_COMMITTED"):
        t.add_files([F])


def test_files_outside_staging_prefix_rejected():
    t = SinkTransaction("t", 7, STAGING)
    outside = FileHandle("s3://b/sink/job/t/data/txn-70/part-00000.parquet", 1, 1, "0" * 64)
    with pytest.raises(SinkError, match="outside its staging prefix"):
        t.pre_commit([outside])
    assert t.state is S.OPEN


def test_recovered_is_pre_committed():
    t = SinkTransaction.recovered("t", 7, STAGING, [F], parent_id=6, full=True)
    assert t.state is S.PRE_COMMITTED and t.files == (F,) and t.full and t.parent_id == 6
