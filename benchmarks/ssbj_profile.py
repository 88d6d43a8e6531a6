"""Profile one stage's steps inside the SSBJ scale benchmark (cProfile).

    python -m benchmarks.ssbj_profile --shape 10:partsupp:20000:0:8 [--stage ssbj]
                                      [--from-step 16] [--out var/bench/prof/ssbj.txt]

Runs ``benchmarks.ssbj_scale`` for one shape and profiles the named stage's
``PipelineRunner.run_stage_step`` calls from ``--from-step`` on (the measured steps by
default: after the 2 warm-up R-cycles of k steps), every other mode running unprofiled
beside it; writes the functions by cumulative time (pstats), summed over the profiled
steps, and the raw statistics as ``<out>.prof`` (``python -m pstats`` reads them).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import ssbj_scale
from pipeline.runner import PipelineRunner

logger = logging.getLogger("bench")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", required=True, help="SCALE:MASTER:BATCH:Z:K")
    parser.add_argument("--stage", default="ssbj", choices=list(ssbj_scale.STAGE_MODES))
    parser.add_argument("--from-step", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("var/bench/prof/ssbj.txt"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    shape = ssbj_scale.Shape.parse(args.shape)
    first = 2 * shape.k if args.from_step is None else args.from_step
    profiler = cProfile.Profile()
    original = PipelineRunner.run_stage_step
    profiled = 0

    def run_stage_step(self: PipelineRunner, stage: Any, run_id: str, *rest: Any) -> Any:
        nonlocal profiled
        # The benchmark's steps are run ids "s<step>"; drains and the idle step are not.
        if stage.name == args.stage and run_id[1:].isdigit() and int(run_id[1:]) >= first:
            profiled += 1
            profiler.enable()
            try:
                return original(self, stage, run_id, *rest)
            finally:
                profiler.disable()
        return original(self, stage, run_id, *rest)

    PipelineRunner.run_stage_step = run_stage_step  # type: ignore[method-assign,assignment]
    try:
        code = ssbj_scale.main(["--shapes", args.shape, "--out", str(args.out) + ".md"])
    finally:
        PipelineRunner.run_stage_step = original  # type: ignore[method-assign]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    args.out.write_text(text.getvalue())
    # The raw statistics beside it, for callers and callees (python -m pstats FILE).
    profiler.dump_stats(str(args.out.with_suffix(".prof")))
    logger.info("profiled %d step(s) of %s: %s", profiled, args.stage, args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
