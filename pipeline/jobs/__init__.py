"""Job registry: jobs known to the CLI and the Airflow DAG factory by name."""
from __future__ import annotations

from collections.abc import Callable

from pipeline.exceptions import ConfigError
from pipeline.job import Job
from pipeline.jobs.ad_clicks import build_job as build_ad_clicks
from pipeline.jobs.customer_spend import build_job as build_customer_spend
from pipeline.jobs.orders_payments import build_job

__all__ = ["get_job", "register_job", "job_names"]

_REGISTRY: dict[str, Callable[[], Job]] = {}


def register_job(name: str, factory: Callable[[], Job]) -> None:
    _REGISTRY[name] = factory


def _load_builtin() -> None:
    if "orders_payments" not in _REGISTRY:
        register_job("orders_payments", build_job)
    if "ad_clicks" not in _REGISTRY:
        register_job("ad_clicks", build_ad_clicks)
    if "customer_spend" not in _REGISTRY:
        register_job("customer_spend", build_customer_spend)


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
        # a dotted module path of identifiers and one function name: '../x:y', '.x:y', 'a b:c' and 'x:y:z' are
        # refused here as configuration errors, not handed to importlib (relative imports raise TypeError there)
        if not all(part.isidentifier() for part in mod.split(".")) or not fn.isidentifier():
            raise ConfigError(f"--job {name!r}: use module:function, an absolute dotted module path on PYTHONPATH "
                              f"and a function name (a function returning a pipeline.Job)")
        try:
            module = importlib.import_module(mod)
        except ImportError as e:
            raise ConfigError(f"cannot load job {name!r}: {e}") from None
        except Exception as e:  # the user's module failed at import: say which, no traceback
            raise ConfigError(f"cannot load job {name!r}: importing {mod} failed: {type(e).__name__}: {e}") from None
        try:
            factory = getattr(module, fn)
        except AttributeError as e:
            raise ConfigError(f"cannot load job {name!r}: {e}") from None
        if isinstance(factory, Job):
            return factory
        if not callable(factory):
            raise ConfigError(f"--job {name!r}: {fn} is a {type(factory).__name__}, not a function returning a Job")
        try:
            job = factory()
        except ConfigError:
            raise
        except Exception as e:  # the user's job factory failed: say where, no traceback
            raise ConfigError(f"--job {name!r}: calling {fn}() failed: {type(e).__name__}: {e}") from None
        if not isinstance(job, Job):
            raise ConfigError(f"--job {name!r}: {fn}() returned a {type(job).__name__}, not a pipeline.Job")
        return job
    raise ConfigError(f"unknown job {name!r}; known jobs: {', '.join(sorted(_REGISTRY))} (or module:function)")
