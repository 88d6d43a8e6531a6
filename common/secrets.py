"""Keep secrets out of messages and logs.

Two things can carry a secret into a message: a database URL with a password (the state
store's), and a value substituted for a ``${VAR}`` reference in the config. This module

* renders URLs with the password masked (:func:`mask_url`), also URLs that do not parse;
* keeps a process-wide registry of secret values (:func:`register_secret`,
  :func:`register_url_password`) that the config loader and the state store fill in;
* masks registered values and URL passwords in any text (:func:`redact`), and in every log
  record that passes a handler carrying :class:`SecretMaskingFilter`
  (:func:`install_secret_filter`, which ``enrich`` calls on the handlers it configures).

It imports SQLAlchemy's URL parser only when a URL is parsed: importing SQLAlchemy costs
about 0.3 s, which every DAG task's client process (a worker client that runs nothing
itself) and every DAG file parse would pay for logging set-up alone.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

MASK = "***"
# Values shorter than this are not masked by substring: masking "ab" everywhere would make
# every log line unreadable. URL passwords are still masked by position (URL_PASSWORD).
MIN_SECRET_LENGTH = 4
SECRET_NAME = re.compile(
    r"pass(word|wd)?|secret|token|credential|api_?key|private_?key|auth", re.IGNORECASE
)
# ``scheme://user:password@`` inside free text; the password stops at the first '@'.
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@]*:)[^\s@]+@")
# The same at the start of a whole URL string: the password runs to the last '@', so that
# an unencoded '@' or ':' in it cannot leak a part of it when the URL does not parse.
WHOLE_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@]*:)(.*)@", re.DOTALL)


class _Registry:
    """The secret values of this process; readers take the ``ordered`` snapshot, no lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self.ordered: tuple[str, ...] = ()  # longest first, so no secret is masked in part

    def add(self, *values: str) -> None:
        with self._lock:
            self._values.update(values)
            self.ordered = tuple(sorted(self._values, key=len, reverse=True))


_registry = _Registry()


def looks_secret(name: str) -> bool:
    """Whether a config key or environment variable name suggests its value is a secret."""
    return SECRET_NAME.search(name) is not None


def register_secret(value: str) -> None:
    """Mask ``value`` (and its URL-encoded form) in every later :func:`redact` and log line."""
    if len(value) >= MIN_SECRET_LENGTH:
        _registry.add(value, quote(value, safe=""))


def register_url_password(url: str) -> None:
    """Register the password of a database URL, if it has one."""
    for password in _url_passwords(url):
        register_secret(password)


def registered_secrets() -> tuple[str, ...]:
    return _registry.ordered


def redact(text: str) -> str:
    """``text`` with registered secrets and the passwords of URLs in it replaced by ***."""
    for secret in _registry.ordered:
        if secret in text:
            text = text.replace(secret, MASK)
    return URL_PASSWORD.sub(rf"\1{MASK}@", text)


def mask_url(url: str) -> str:
    """``url`` for messages: the password masked, also when the URL does not parse."""
    parsed = _parsed_url(url)
    if parsed is None:  # does not parse: mask by position instead
        return redact(WHOLE_URL_PASSWORD.sub(rf"\1{MASK}@", url))
    # Without a password, the URL as written (rendering would percent-encode a path's '@').
    shown = url if parsed.password is None else parsed.render_as_string(hide_password=True)
    return redact(shown)


def _url_passwords(url: str) -> list[str]:
    passwords = []
    parsed = _parsed_url(url)  # an unparsable URL still may carry a password (below)
    if parsed is not None and parsed.password:
        passwords.append(str(parsed.password))
    match = WHOLE_URL_PASSWORD.match(url)
    if match and match.group(2):
        passwords.append(match.group(2))  # as written, e.g. percent-encoded
    return passwords


def _parsed_url(url: str) -> URL | None:
    """``url`` parsed by SQLAlchemy, or None when it does not parse. SQLAlchemy is
    imported here, when a URL is parsed (module docstring)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        return None


class SecretMaskingFilter(logging.Filter):
    """Masks registered secrets and URL passwords in a record's message, args and traceback.

    Attach it to handlers, not loggers: a logger's filters do not see records that
    propagate from child loggers, a handler's see every record it emits.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {key: _redact_arg(value) for key, value in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(value) for value in record.args)
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # a bad format string: the handler says so
            message = None
        if message is not None:
            masked = redact(message)
            if masked != message:  # a secret spans msg and args, or hides in an object's repr
                record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.exc_info and record.exc_info[1] is not None:
            # A formatter may render the exception itself instead of ``exc_text`` (PySpark's
            # JSON formatter writes ``str(exception)``): it gets a stand-in whose text is
            # masked, the type and traceback kept.
            kind, error, trace = record.exc_info
            text = str(error)
            masked = redact(text)
            if masked != text:
                record.exc_info = (kind, MaskedError(masked), trace)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class MaskedError(Exception):
    """Stands in for a logged exception whose message held a secret: the masked message."""


def _redact_arg(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact(value)
    text = str(value)
    masked = redact(text)
    return value if masked == text else masked


def install_secret_filter(handlers: Iterable[logging.Handler]) -> None:
    """Add one :class:`SecretMaskingFilter` to each handler that has none yet."""
    for handler in handlers:
        if not any(isinstance(f, SecretMaskingFilter) for f in handler.filters):
            handler.addFilter(SecretMaskingFilter())
