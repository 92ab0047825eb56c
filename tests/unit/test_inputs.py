"""User-input checks done before any side effect (pipeline.inputs)."""
import pytest

from pipeline.exceptions import ConfigError
from pipeline.inputs import check_parallelism, check_savepoint_target, check_snapshot_ref

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bad", ["/data/sp", "data/sp", "s3a://b/p", "s3:///p", "file://relative/p", "file:///", "http://x/y"])
def test_bad_savepoint_targets(bad):
    with pytest.raises(ConfigError) as e:
        check_savepoint_target(bad)
    assert repr(bad) in str(e.value)


def test_good_inputs():
    assert check_savepoint_target(None) is None and check_savepoint_target("  ") is None
    assert check_savepoint_target("s3://b/p/") == "s3://b/p"
    assert check_savepoint_target("file:///tmp/sp") == "file:///tmp/sp"
    assert check_snapshot_ref(" 12 ") == "12" and check_snapshot_ref(7) == "7"
    assert check_snapshot_ref("s3://b/job/savepoints/sp-3-x/") == "s3://b/job/savepoints/sp-3-x"
    assert check_parallelism(None) is None and check_parallelism("") is None and check_parallelism("3") == 3


@pytest.mark.parametrize("bad", ["", None, "0", "-1", "/x/sp"])
def test_bad_snapshot_refs(bad):
    with pytest.raises(ConfigError):
        check_snapshot_ref(bad)


@pytest.mark.parametrize("bad", [0, -2, "two"])
def test_bad_parallelism(bad):
    with pytest.raises(ConfigError):
        check_parallelism(bad)
