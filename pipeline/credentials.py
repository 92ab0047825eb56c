"""AWS credentials on the executors, the way AWS SDKs find them, without writing a secret anywhere.

Epochal's S3 I/O runs in Python on the executors (boto3 and ``pyarrow.fs.S3FileSystem``). Both resolve
credentials with the standard **default credential chain** when no keys are given explicitly:

1. environment: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (temporary keys);
2. shared files and profiles: ``AWS_PROFILE``, ``AWS_CONFIG_FILE``, ``AWS_SHARED_CREDENTIALS_FILE``;
3. web identity (EKS IRSA): ``AWS_ROLE_ARN`` + ``AWS_WEB_IDENTITY_TOKEN_FILE`` (+ ``AWS_ROLE_SESSION_NAME``);
4. container credentials (ECS, EKS pod identity): ``AWS_CONTAINER_CREDENTIALS_*``,
   ``AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)``;
5. instance metadata (IMDS), which needs nothing.

So the driver forwards to the executors exactly the chain's inputs it has (:func:`chain_env`), and each
executor runs the chain itself: temporary credentials refresh there, a role is assumed there, and an
executor on a node with its own instance profile needs nothing at all. Nothing is resolved on the driver
and shipped as frozen keys.

**How they travel.** Not as ``spark.executorEnv.*`` (that is Spark configuration: it shows in
``getConf().getAll()`` and in any conf dump), but through PySpark's task environment
(``SparkContext.environment``): every Python function Spark ships to an executor carries it, and the
executor's Python workers start with it in their environment (:func:`forward_to_executors`). It is part of
the serialized task, never of the configuration, the event log or the logs. As a second line,
``spark.redaction.regex`` is widened (:data:`REDACTION_REGEX`) so Spark redacts anything credential-like
that someone else puts into the configuration.
"""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CHAIN_ENV", "SECRET_ENV", "REDACTION_REGEX", "chain_env", "forward_to_executors", "secret_values"]

#: environment variables the default credential chain (and the S3 client settings) read
CHAIN_ENV: tuple[str, ...] = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_DISABLED", "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CA_BUNDLE",
    "AWS_STS_REGIONAL_ENDPOINTS",
)

#: the ones whose values are secrets
SECRET_ENV: frozenset[str] = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                                        "AWS_CONTAINER_AUTHORIZATION_TOKEN"})

#: Spark's default redaction pattern plus credential-like names
REDACTION_REGEX = r"(?i)secret|password|token|access[._]?key|credential|session[._]?token"


def chain_env(env: Mapping[str, str]) -> dict[str, str]:
    """The credential-chain inputs present (non-empty) in ``env``."""
    return {k: env[k] for k in CHAIN_ENV if env.get(k)}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The secret values in ``env`` (to check that none of them was written anywhere)."""
    return [env[k] for k in SECRET_ENV if env.get(k)]


def forward_to_executors(sc, env: Mapping[str, str]) -> list[str]:
    """Put the chain's inputs into the task environment of ``sc`` (a classic SparkContext): every Python
    function shipped after this call sets them in its executor Python worker. Returns the names forwarded
    (never the values)."""
    values = chain_env(env)
    sc.environment.update(values)
    return sorted(values)
