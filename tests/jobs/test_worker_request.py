"""The warm worker's clients read their global options without the CLI's parser
(``jobs.worker_request``); whatever that reader does not know is the parser's."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.cli import build_parser
from jobs.worker_request import DEFAULT_CONFIG, WORKER_COMMANDS, worker_request


def test_a_task_s_command_line_is_read_as_the_parser_reads_it() -> None:
    request = worker_request(
        [
            *("--config", "p.yaml", "--log-level=debug", "--master", "local[1]", "--wait", "5"),
            *("--worker", "stage", "orders", "--run-id", "r1"),
        ]
    )
    assert request is not None
    assert request.config == Path("p.yaml")
    assert request.master == "local[1]"
    assert request.log_level == "DEBUG"
    # forwarded without --worker, every other option as given
    assert request.argv == [
        *("--config", "p.yaml", "--log-level=debug", "--master", "local[1]", "--wait", "5"),
        *("stage", "orders", "--run-id", "r1"),
    ]
    default = worker_request(["--worker", "run"])
    assert default is not None and default.config == Path(DEFAULT_CONFIG)
    assert default.log_level == "INFO" and default.master is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "p.yaml", "run"],  # not sent to a worker
        ["--worker", "stream"],  # a command that runs on its own
        ["--worker", "worker", "--stop"],
        ["--worker", "--help"],
        ["--version"],
        ["--conf", "p.yaml", "--worker", "run"],  # an abbreviation: argparse's to accept
        ["--worker", "--log-level", "loud", "run"],  # the parser says what is wrong
        ["--worker", "--config"],
        ["--worker"],
        ["--worker", "nosuchcommand"],
    ],
)
def test_anything_else_is_left_to_the_parser(argv: list[str]) -> None:
    assert worker_request(argv) is None


def test_the_worker_commands_are_the_parser_s_but_those_that_run_on_their_own() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert commands.choices is not None
    assert set(commands.choices) - {"worker", "spark-server", "stream"} == WORKER_COMMANDS
