"""The public API is pinned (httpx ``tests/test_exported_members.py``): changing it is a decision, not an
accident. Every name in ``__all__`` exists, and every public class/function defined in the module is in it."""
from __future__ import annotations

import importlib
import inspect

import pytest

pytestmark = pytest.mark.unit

PINNED = {
    "pipeline": ["EpochalError", "Job", "JobRunner", "PipelineConfig", "Stream", "__version__", "load_config"],
    "pipeline.exceptions": [
        "AggregateOverflowError", "BarrierError", "BootstrapRefusedError", "CheckpointDeclinedError", "CheckpointError", "CheckpointFencedError",
        "ConditionalWriteError", "ConfigError", "CorruptCheckpointError", "CorruptStreamError", "EpochalError",
        "IncompatibleSinkSchemaError", "IncompatibleStateError", "InjectedFailure", "JobStoppedError", "LakeSourceError",
        "MalformedInputError",
        "NoValidCheckpointError", "ObjectNotFoundError", "SinkError", "SourceContractError", "SourceError", "StateStoreError", "StorageError",
        "TooManyFailedCheckpointsError", "TransactionStateError", "TypeMismatch", "UserFunctionError", "ValidationError",
    ],
    "pipeline.fileio": [
        "FileIO", "FileInfo", "InMemoryFileIO", "LocalFileIO", "S3FileIO", "file_io_for", "file_io_serving", "join_uri",
        "register_scheme", "sha256_of", "sha256_of_file", "split_s3_uri",
    ],
    "pipeline.runtime.driver.runner": ["Cursor", "JobRunner", "RoundResult", "RunReport"],
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_all_is_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == PINNED[module]
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but missing"


@pytest.mark.parametrize("module", ["pipeline.exceptions", "pipeline.fileio", "pipeline.layout"])
def test_public_definitions_are_exported(module):
    mod = importlib.import_module(module)
    defined = {n for n, v in vars(mod).items() if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
               and getattr(v, "__module__", "").startswith(module)}
    assert defined <= set(mod.__all__), sorted(defined - set(mod.__all__))


def test_every_error_is_an_epochal_error_except_the_injected_crash():
    exc = importlib.import_module("pipeline.exceptions")
    for name in exc.__all__:
        cls = getattr(exc, name)
        if name == "InjectedFailure":
            assert not issubclass(cls, exc.EpochalError)  # must act like a crash
        else:
            assert issubclass(cls, exc.EpochalError), name
