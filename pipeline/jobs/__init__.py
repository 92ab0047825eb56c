"""Job registry: jobs known to the CLI and the Airflow DAG factory by name."""
from __future__ import annotations

from typing import Callable

from pipeline.exceptions import ConfigError
from pipeline.job import Job

__all__ = ["get_job", "register_job", "job_names"]

_REGISTRY: dict[str, Callable[[], Job]] = {}


def register_job(name: str, factory: Callable[[], Job]) -> None:
    _REGISTRY[name] = factory


def _load_builtin() -> None:
    if "orders_payments" not in _REGISTRY:
        from pipeline.jobs.orders_payments import build_job
        register_job("orders_payments", build_job)
    if "ad_clicks" not in _REGISTRY:
        from pipeline.jobs.ad_clicks import build_job as build_ad_clicks
        register_job("ad_clicks", build_ad_clicks)


def job_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_job(name: str) -> Job:
    """Look a job up by name; ``module:function`` also works for user jobs."""
    _load_builtin()
    if name in _REGISTRY:
        return _REGISTRY[name]()
    if ":" in name:
        import importlib
        mod, _, fn = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), fn)()
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"cannot load job {name!r}: {e}") from None
    raise ConfigError(f"unknown job {name!r}; known jobs: {', '.join(sorted(_REGISTRY))} (or module:function)")
