"""docker-compose.yaml wiring (there is no Docker engine here: parse it and check what matters)."""
from __future__ import annotations

import re

import pytest
import yaml
from af_helpers import REPO

pytestmark = [pytest.mark.unit]

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def _pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s#;]+)", line.strip())
        if m:
            out[m.group(1).split("[")[0].lower()] = m.group(2)
    return out


def _env(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def test_services(compose):
    services = compose["services"]
    for name in (*AIRFLOW_SERVICES, "postgres", "minio", "spark-master", "spark-worker", "airflow-init"):
        assert name in services, name
    cmds = {n: services[n]["command"] for n in AIRFLOW_SERVICES}
    assert cmds == {"airflow-apiserver": ["api-server"], "airflow-scheduler": ["scheduler"],
                    "airflow-dag-processor": ["dag-processor"], "airflow-triggerer": ["triggerer"]}
    assert any(p.endswith(":8080:8080") for p in services["airflow-apiserver"]["ports"])


def test_images_are_pinned(compose):
    pins = _pins()
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        tag = image.rsplit(":", 1)[-1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned"
        build = svc.get("build")
        if build:
            df = build["dockerfile_inline"]
            base = re.search(r"^FROM\s+(\S+)", df, re.M).group(1)
            assert base == f"apache/airflow:{pins['apache-airflow']}-python3.11", base
            assert "requirements.txt" in df  # pinned Python deps (pyspark, pyarrow, boto3, ...)
    assert pins["pyspark"] in compose["services"]["spark-master"]["image"], \
        "the Spark cluster must run the pyspark version of requirements.txt"


def test_airflow_env_wiring(compose):
    for name in AIRFLOW_SERVICES:
        env = _env(compose["services"][name])
        assert env["PIPELINE_SPARK_MASTER"] == "sc://spark-connect:15002"  # the long-lived Connect server
        for k in ("PIPELINE_SOURCE_URI", "PIPELINE_CHECKPOINT_URI", "PIPELINE_SINK_URI"):
            assert env[k].startswith("s3://epochal/"), (name, k, env[k])
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert env["EPOCHAL_AWS_CONN_ID"] == "epochal_s3"
        assert '"endpoint_url": "http://minio:9000"' in env["AIRFLOW_CONN_EPOCHAL_S3"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql") and "@postgres:" in \
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"], "all Airflow services must share the JWT secret"
        deps = compose["services"][name]["depends_on"]
        assert {"postgres", "minio-init", "airflow-init", "spark-connect"} <= set(deps)
    assert _env(compose["services"]["airflow-scheduler"])["SPARK_LOCAL_HOSTNAME"] == "airflow-scheduler"
    assert compose["services"]["airflow-scheduler"]["hostname"] == "airflow-scheduler"


def test_mounts(compose):
    for name in AIRFLOW_SERVICES:
        vols = compose["services"][name]["volumes"]
        for d in ("pipeline", "dags", "plugins", "include"):
            assert f"./{d}:/opt/airflow/{d}" in vols, (name, d)
        assert _env(compose["services"][name])["PYTHONPATH"] == "/opt/airflow"
    for name in ("spark-master", "spark-worker", "spark-connect"):
        assert "./pipeline:/opt/airflow/pipeline" in compose["services"][name]["volumes"]
        assert _env(compose["services"][name])["PYTHONPATH"] == "/opt/airflow"
    assert set(compose["volumes"]) >= {"postgres-db", "minio-data"}


def test_spark_cluster(compose):
    m, w = compose["services"]["spark-master"], compose["services"]["spark-worker"]
    assert "org.apache.spark.deploy.master.Master" in m["command"] and "7077" in m["command"]
    assert "org.apache.spark.deploy.worker.Worker" in w["command"]
    assert "spark://spark-master:7077" in w["command"]
    assert m["image"] == w["image"] == compose["services"]["airflow-scheduler"]["image"], \
        "driver (Airflow tasks) and executors must share Python and packages"


def test_spark_connect_server(compose):
    """Airflow tasks connect to a long-lived Spark Connect server that runs on the standalone cluster, with the
    same image (Python + packages) as the executors and its own S3 settings."""
    c = compose["services"]["spark-connect"]
    assert c["entrypoint"][0].endswith("pyspark/sbin/start-connect-server.sh")
    cmd = c["command"]
    assert cmd[0] == "--wait" and cmd[cmd.index("--master") + 1] == "spark://spark-master:7077"
    assert "spark.connect.grpc.binding.port=15002" in cmd and c["hostname"] == "spark-connect"
    assert c["image"] == compose["services"]["spark-worker"]["image"]
    env = _env(c)
    assert env["SPARK_HOME"] + "/sbin/start-connect-server.sh" == c["entrypoint"][0]
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000" and env["PYTHONPATH"] == "/opt/airflow"
    assert not c.get("ports"), "the Connect server is reached inside the compose network only"


def test_minio_bucket_and_s3(compose):
    init = " ".join(compose["services"]["minio-init"]["command"])
    assert "mb --ignore-existing local/epochal" in init and "http://minio:9000" in init
    env = _env(compose["services"]["minio"])
    air = _env(compose["services"]["airflow-scheduler"])
    assert env["MINIO_ROOT_USER"] == air["AWS_ACCESS_KEY_ID"]
    assert env["MINIO_ROOT_PASSWORD"] == air["AWS_SECRET_ACCESS_KEY"]


# -- the compose specification and secrets -------------------------------------------------------------------
_INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?])?([^}]*)\}")


def test_valid_against_the_compose_specification(compose):
    """The file validates against the Compose Specification's JSON schema (compose-spec/compose-spec,
    schema/compose-spec.json, Apache-2.0, vendored in tests/airflow/schemas): what `docker compose config`
    checks first, without a Docker engine."""
    import json

    import jsonschema
    schema = json.loads((REPO / "tests" / "airflow" / "schemas" / "compose-spec.json").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:10])
    # and a broken file is refused (the check can fail)
    broken = {**compose, "services": {**compose["services"], "postgres": {**compose["services"]["postgres"],
                                                                          "ports": [{"published": []}]}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_fernet_key_is_required_and_secrets_are_called_out(compose):
    """Airflow gets a Fernet key that the user must supply (no key in the repository), and every secret-like
    value is an interpolation whose default (if any) is named in the file's header."""
    text = (REPO / "docker-compose.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for name in AIRFLOW_SERVICES:
        env = _env(compose["services"][name])
        fernet = env.get("AIRFLOW__CORE__FERNET_KEY", "")
        m = _INTERPOLATION.fullmatch(fernet)
        assert m and ":?" in fernet, f"{name}: the Fernet key must be required from the environment: {fernet!r}"
    secret_keys = re.compile(r"(PASSWORD|SECRET|FERNET)", re.I)
    for name, svc in compose["services"].items():
        for k, v in _env(svc).items():
            if secret_keys.search(k):
                m = _INTERPOLATION.fullmatch(v)
                assert m, f"{name}: {k} is a literal secret ({v!r}); interpolate it and call it out in the header"
                assert m.group(1) in header, f"{name}: {k} uses ${{{m.group(1)}}}, not explained in the header"
    for m in _INTERPOLATION.finditer(text):
        if secret_keys.search(m.group(1)):
            assert m.group(1) in header, f"${{{m.group(1)}}} is not called out in the header"
