"""Which master wins (launcher > existing session > PIPELINE_SPARK_MASTER > local[*]) and which credential-chain
inputs are forwarded to executors."""
from __future__ import annotations

import pytest

from pipeline.config import load_config
from pipeline.credentials import CHAIN_ENV, SECRET_ENV, chain_env
from pipeline.master import DEFAULT_MASTER, MasterSource, choose_master

pytestmark = [pytest.mark.unit]


def test_default_only_when_nothing_else_set_a_master():
    c = choose_master(load_config(env={}).spark_master, env={})
    assert (c.master, c.source, c.builder_master, c.note()) == (DEFAULT_MASTER, MasterSource.DEFAULT, "local[*]", None)


def test_configured_master_applies_without_a_launcher():
    c = choose_master("spark://h:7077", env={})
    assert c.source is MasterSource.CONFIG and c.builder_master == "spark://h:7077"


def test_spark_submit_wins_over_the_configured_master_and_says_so():
    c = choose_master("local[*]", env={"PYSPARK_GATEWAY_PORT": "4242"})
    assert c.source is MasterSource.LAUNCHER and c.builder_master is None  # the JVM's spark.master stands
    assert "PIPELINE_SPARK_MASTER=local[*] not applied" in c.note()
    assert choose_master(None, env={"PYSPARK_GATEWAY_PORT": "1"}).note() is None


def test_pyspark_submit_args_master_wins():
    c = choose_master("local[2]", env={"PYSPARK_SUBMIT_ARGS": "--conf a=b --master spark://x:7077 pyspark-shell"})
    assert (c.master, c.source, c.builder_master) == ("spark://x:7077", MasterSource.LAUNCHER, None)
    c = choose_master("", env={"PYSPARK_SUBMIT_ARGS": "--conf spark.eventLog.enabled=true pyspark-shell"})
    assert c.source is MasterSource.DEFAULT


def test_existing_session_wins():
    c = choose_master("local[1]", env={}, active_master="spark://a:7077")
    assert c.source is MasterSource.SESSION and c.builder_master is None and c.master == "spark://a:7077"


def test_chain_env_forwards_every_chain_input_present_and_nothing_else():
    env = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "tok",
           "AWS_PROFILE": "p", "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token", "AWS_ROLE_ARN": "arn:x",
           "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1", "AWS_REGION": "eu-west-1",
           "AWS_EMPTY": "", "AWS_CONFIG_FILE": "", "HOME": "/root", "PIPELINE_PARALLELISM": "2"}
    got = chain_env(env)
    assert set(got) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                        "AWS_REGION"}
    assert SECRET_ENV <= set(CHAIN_ENV)


def test_shared_session_url_gives_one_session_per_key_that_spark_connect_accepts():
    """The epoch DAG's tasks of a job attach to one Spark Connect session (warm Python workers between tasks): the
    id is derived from the key, valid for the client (a version-4 UUID), and an explicit session id is kept."""
    import uuid

    from pyspark.sql.connect.client.core import DefaultChannelBuilder as ChannelBuilder

    from pipeline.master import check_master_usable, connect_endpoint, shared_session_url
    a = shared_session_url("sc://127.0.0.1:15002", "epochs|orders|s3://b/chk")
    assert a == shared_session_url("sc://127.0.0.1:15002/", "epochs|orders|s3://b/chk")  # deterministic
    assert a != shared_session_url("sc://127.0.0.1:15002", "epochs|clicks|s3://b/chk")   # one per job
    sid = ChannelBuilder(a).session_id  # the client's own parsing and validation of the URL
    assert sid is not None and uuid.UUID(sid).version == 4 and a.endswith(f"/;session_id={sid}")
    assert connect_endpoint(a) == ("127.0.0.1", 15002)
    check_master_usable(a, env={})
    with_params = shared_session_url("sc://h:15002/;use_ssl=false", "k")
    assert with_params.startswith("sc://h:15002/;use_ssl=false;session_id=")
    assert ChannelBuilder(with_params).session_id is not None
    explicit = f"sc://h:15002/;session_id={uuid.uuid4()}"
    assert shared_session_url(explicit, "k") == explicit
