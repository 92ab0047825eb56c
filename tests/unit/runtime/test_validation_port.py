"""The runtime validates through a port (pipeline/runtime/driver/validation.py); ``import pipeline`` registers the
quality package's validator, and a runner that needs one and finds none says so instead of skipping."""
from __future__ import annotations

import pytest

import pipeline  # noqa: F401  (registers the default validator)
from pipeline.exceptions import ConfigError
from pipeline.quality.validator import QualityValidator
from pipeline.runtime.driver import validation

pytestmark = pytest.mark.unit


def test_import_pipeline_registers_the_quality_validator():
    v = validation.default_validator("a test")
    assert isinstance(v, QualityValidator) and isinstance(v, validation.RecoveryValidator)


def test_no_validator_is_a_clear_error_not_a_silent_skip():
    saved = validation.default_validator("a test")
    validation.set_default_validator(None)
    try:
        with pytest.raises(ConfigError, match=r"restore\(validate=True\) needs a validator"):
            validation.default_validator("restore(validate=True)")
    finally:
        validation.set_default_validator(saved)
