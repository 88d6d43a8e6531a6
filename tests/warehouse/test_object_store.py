"""Object-store locations and settings: parsed, checked and masked without a server."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from common.secrets import redact
from warehouse.object_store import ObjectLocation, ObjectStore, is_object_store

ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:8333/",
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
    "AWS_REGION": "eu-central-1",
}


def test_locations_with_an_s3_scheme_are_object_store_locations() -> None:
    assert is_object_store("s3://bucket/warehouse") and is_object_store("S3A://b/k")
    assert not is_object_store("/var/warehouse") and not is_object_store("file:///tmp/x")
    assert ObjectLocation.parse("s3://bucket/a/b/") == ObjectLocation("bucket", "a/b/")
    assert ObjectLocation.parse("s3a://bucket") == ObjectLocation("bucket", "")
    for bad in ("s3:///no-bucket", "/local/path", "gs://bucket/x"):
        with pytest.raises(ConfigError, match=r"expected an object-store location s3://"):
            ObjectLocation.parse(bad)


def test_settings_come_from_the_environment_and_never_show_the_secret() -> None:
    store = ObjectStore.from_environment(ENV)
    assert store.endpoint == "http://127.0.0.1:8333" and store.region == "eu-central-1"
    assert store.allow_http
    shown = repr(store)
    assert "wJalrXUtnFEMI/K7MDENG" not in shown and "AKIDEXAMPLE" not in shown
    assert "wJalrXUtnFEMI/K7MDENG" not in redact(f"failed with {store.secret_access_key}")
    options = store.delta_options()
    assert options["AWS_CONDITIONAL_PUT"] == "etag"  # commits are put with If-None-Match
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    conf = store.spark_conf()
    assert conf["spark.hadoop.fs.s3.impl"] == conf["spark.hadoop.fs.s3a.impl"]
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.secret.key"] == ENV["AWS_SECRET_ACCESS_KEY"]
    # Without an endpoint: AWS itself, over TLS, with the SDK's own region default.
    aws = ObjectStore.from_environment({})
    assert aws.endpoint is None and aws.region == "us-east-1" and not aws.allow_http
    assert "AWS_ENDPOINT_URL" not in aws.delta_options()
    assert "spark.hadoop.fs.s3a.access.key" not in aws.spark_conf()


def test_half_a_credential_or_a_bad_endpoint_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="only AWS_ACCESS_KEY_ID is set"):
        ObjectStore.from_environment({"AWS_ACCESS_KEY_ID": "AKID"})
    with pytest.raises(ConfigError, match="only AWS_SECRET_ACCESS_KEY is set"):
        ObjectStore.from_environment({"AWS_SECRET_ACCESS_KEY": "secret"})
    with pytest.raises(ConfigError, match=r"http:// or https://.*'127.0.0.1:8333'"):
        ObjectStore.from_environment({"AWS_ENDPOINT_URL": "127.0.0.1:8333"})
