"""The command line's frozen arguments: every field is filled from an option by name."""

from __future__ import annotations

import argparse
from dataclasses import fields

from jobs.cli import OPTION_OF, JobArgs, build_parser, parse_args


def _option_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every option's ``dest``, of the parser and of each subcommand."""
    names = {action.dest for action in parser._actions}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _option_names(sub)
    return names


def test_every_argument_field_has_an_option_of_its_name() -> None:
    """A field whose option is renamed would silently keep its default."""
    options = _option_names(build_parser())
    unfilled = [
        f.name
        for f in fields(JobArgs)
        if f.name != "run_id" and OPTION_OF.get(f.name, f.name) not in options
    ]
    assert unfilled == []


def test_options_reach_their_fields_and_absent_ones_keep_the_defaults() -> None:
    args, _ = parse_args(
        ["--config", "c.yaml", "--worker", "--wait", "5", "stage", "orders", "--steps", "2"]
    )
    assert (args.command, args.stage, args.steps, args.via_worker, args.wait_seconds) == (
        "stage",
        "orders",
        2,
        True,
        5.0,
    )
    assert (args.scale, args.intervals, args.as_json, args.start) == (0.01, 3, False, None)
    assert args.run_id.startswith("stage__")
