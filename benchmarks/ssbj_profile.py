"""Profile one stage's steps inside the SSBJ scale benchmark (cProfile).

    python -m benchmarks.ssbj_profile --shape 10:partsupp:20000:0:8 [--stage ssbj meshjoin]
                                      [--from-step 16] [--bound 1|k] [--cycles 3]
                                      [--out var/bench/prof/ssbj.txt]

Runs ``benchmarks.ssbj_scale`` for one shape and profiles the named stages'
``PipelineRunner.run_stage_step`` calls from ``--from-step`` on (the measured steps by
default: after the 2 warm-up R-cycles of k steps), each stage with a profiler of its own,
every other mode running unprofiled beside them; writes, per stage, the functions by
cumulative time (pstats), summed over the profiled steps, and the raw statistics as
``.prof`` (``python -m pstats`` reads them). With several stages, each file's name gets
the stage's (``ssbj.meshjoin.txt``), so two modes' profiles come from the same batches.
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
    parser.add_argument(
        "--stage", nargs="+", default=["ssbj"], choices=list(ssbj_scale.STAGE_MODES)
    )
    parser.add_argument("--from-step", type=int, default=None)
    parser.add_argument("--bound", choices=("1", "k"), default="1", help="as ssbj_scale's")
    parser.add_argument("--cycles", type=int, default=3, help="as ssbj_scale's")
    parser.add_argument("--out", type=Path, default=Path("var/bench/prof/ssbj.txt"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    shape = ssbj_scale.Shape.parse(args.shape)
    first = 2 * shape.k if args.from_step is None else args.from_step
    profilers = {stage: cProfile.Profile() for stage in args.stage}
    original = PipelineRunner.run_stage_step
    profiled = dict.fromkeys(args.stage, 0)

    def run_stage_step(self: PipelineRunner, stage: Any, run_id: str, *rest: Any) -> Any:
        # The benchmark's steps are run ids "s<step>"; drains and the idle step are not.
        profiler = profilers.get(stage.name)
        if profiler is not None and run_id[1:].isdigit() and int(run_id[1:]) >= first:
            profiled[stage.name] += 1
            profiler.enable()
            try:
                return original(self, stage, run_id, *rest)
            finally:
                profiler.disable()
        return original(self, stage, run_id, *rest)

    PipelineRunner.run_stage_step = run_stage_step  # type: ignore[method-assign,assignment]
    try:
        code = ssbj_scale.main(
            [
                *("--shapes", args.shape, "--bound", args.bound, "--cycles", str(args.cycles)),
                *("--out", str(args.out) + ".md"),
            ]
        )
    finally:
        PipelineRunner.run_stage_step = original  # type: ignore[method-assign]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for stage, profiler in profilers.items():
        out = args.out if len(profilers) == 1 else args.out.with_suffix(f".{stage}.txt")
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
        out.write_text(text.getvalue())
        # The raw statistics beside it, for callers and callees (python -m pstats FILE).
        profiler.dump_stats(str(out.with_suffix(".prof")))
        logger.info("profiled %d step(s) of %s: %s", profiled[stage], stage, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
