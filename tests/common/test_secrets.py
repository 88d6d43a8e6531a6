"""Secrets stay out of messages and logs: masked URLs, registered values, the log filter."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from common.secrets import (
    SecretMaskingFilter,
    install_secret_filter,
    mask_url,
    redact,
    register_secret,
    register_url_password,
)
from jobs.enrich import main

logger = logging.getLogger("warehouse.test_secrets")


def fresh_secret() -> str:
    return f"s3cret-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret@127.0.0.1:1/db", "postgresql://u:***@127.0.0.1:1/db"),
        ("postgresql+psycopg://u:p%40ss%3Aword@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("sqlite:////var/state/pipe@line.db", "sqlite:////var/state/pipe@line.db"),
        ("postgresql://u:s3cret@h:notaport/db", "postgresql://u:***@h:notaport/db"),
        ("postgresql://u:s3c@r:t@h:notaport/db", "postgresql://u:***@h:notaport/db"),
    ],
)
def test_mask_url_hides_the_password_also_of_urls_that_do_not_parse(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_redact_masks_registered_values_and_url_passwords_in_text() -> None:
    secret, url_password = fresh_secret(), fresh_secret()
    register_secret(secret)
    register_secret("ab")  # too short to mask by substring: it would garble every line
    register_url_password(f"postgresql://u:{url_password}@h/db")
    assert redact(f"token={secret}, again {secret}") == "token=***, again ***"
    assert redact(f"bare {url_password} here") == "bare *** here"
    assert redact("a stab at grabbing") == "a stab at grabbing"
    in_text = "to mysql://root:hunter22@h:3306/x and on"
    assert redact(in_text) == "to mysql://root:***@h:3306/x and on"


def test_log_record_carrying_a_secret_is_masked(caplog: pytest.LogCaptureFixture) -> None:
    secret = fresh_secret()
    register_secret(secret)
    install_secret_filter([caplog.handler])
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("connecting with %s", secret)  # in the args
        logger.info(f"connecting with {secret}")  # noqa: G004 - in the message itself
        logger.info("%(who)s used %(what)s", {"who": "task", "what": secret})  # mapping args
        logger.warning("state store %s unreachable", "postgresql://u:hunter22@h/db")
        try:
            raise RuntimeError(f"refused for {secret}")
        except RuntimeError:
            logger.exception("open failed")
    assert len(caplog.records) == 5
    assert secret not in caplog.text and "hunter22" not in caplog.text
    messages = [record.getMessage() for record in caplog.records]
    assert messages[:4] == [
        "connecting with ***",
        "connecting with ***",
        "task used ***",
        "state store postgresql://u:***@h/db unreachable",
    ]
    # The traceback as the standard formatter writes it, or the exception as PySpark's JSON
    # formatter does (a handler's formatter may be PySpark's, depending on what ran before).
    assert "RuntimeError: refused for ***" in caplog.text or (
        '"class": "RuntimeError", "msg": "refused for ***"' in caplog.text
    )


def test_filter_is_installed_once_per_handler() -> None:
    handler = logging.StreamHandler()
    install_secret_filter([handler])
    install_secret_filter([handler])
    assert sum(isinstance(f, SecretMaskingFilter) for f in handler.filters) == 1


def test_enrich_installs_the_filter_on_its_log_handlers(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    secret = fresh_secret()
    register_secret(secret)
    assert main(["--config", str(tmp_path / "missing.yaml"), "status"]) == 2  # config error
    assert any(isinstance(f, SecretMaskingFilter) for f in caplog.handler.filters)
    logging.getLogger("pipeline.runner").error("retry with %s", secret)
    assert secret not in caplog.text and "retry with ***" in caplog.text


def test_an_exception_rendered_by_a_json_formatter_is_masked(tmp_path: Path) -> None:
    """A formatter that writes the exception itself (PySpark's JSON formatter renders
    ``str(exception)``, not the masked traceback text) shows the masked message."""
    import io
    import json

    from pyspark.logger.logger import JSONFormatter

    secret = fresh_secret()
    register_secret(secret)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    install_secret_filter([handler])
    json_logger = logging.getLogger(f"warehouse.test_secrets.json.{tmp_path.name}")
    json_logger.addHandler(handler)
    json_logger.propagate = False
    try:
        raise RuntimeError(f"refused for {secret}")
    except RuntimeError:
        json_logger.exception("open failed")
    entry = json.loads(stream.getvalue().strip())
    assert secret not in stream.getvalue()
    assert entry["exception"]["class"] == "RuntimeError"
    assert entry["exception"]["msg"] == "refused for ***"
