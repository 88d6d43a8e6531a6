"""The stateful SSBJ / MESHJOIN stage of an equi stage in ``ssbj``, ``meshjoin`` (or
``auto``, when it picks SSBJ) mode: :mod:`pipeline.ssbj.driver` (the stage driver) runs the
operator's steps, :mod:`pipeline.ssbj.stage`."""

from __future__ import annotations
