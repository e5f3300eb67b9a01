"""The shipped example series (``assets/series/``), found from any working folder.

    from circuitfade.store.examples import example_series
    series = example_series("fade600to0")          # a CheckpointSeries, 13 checkpoints, steps 0..3600

The two series (``unforced``, ``fade600to0``; 4.5 MB of weights) live in the
repository's ``assets/series/``, not in the wheel, to keep installs small. They are
found, in this order:

1. ``$CIRCUITFADE_ASSETS/series/<name>`` (``CIRCUITFADE_ASSETS``: a folder holding
   ``series/``, e.g. a copy of the repository's ``assets/``);
2. ``assets/series/<name>`` of the source tree the package was imported from (a clone,
   with ``pip install -e .`` as ``make`` does) - so notebooks and scripts work from any
   working folder.

Otherwise :func:`example_series_dir` raises ``FileNotFoundError`` saying how to get them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["EXAMPLE_SERIES", "ENV_VAR", "assets_dir", "example_series_dir", "example_series"]

EXAMPLE_SERIES = ("unforced", "fade600to0")
"""Names of the shipped series (seed 0, associative recall, 3,600 steps, weights every 300)."""
ENV_VAR = "CIRCUITFADE_ASSETS"


def assets_dir() -> Path:
    """The folder holding ``series/``: ``$CIRCUITFADE_ASSETS`` if set, else the source tree's ``assets/``."""
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if not (p / "series").is_dir():
            raise FileNotFoundError(f"{ENV_VAR}={env}: expected a folder holding series/ (the repository's assets/)")
        return p
    p = Path(__file__).resolve().parents[2] / "assets"
    if (p / "series").is_dir():
        return p
    raise FileNotFoundError(
        "the example series are not installed with the package (to keep installs small): clone the repository "
        f"and pip install -e . there, or set {ENV_VAR} to a copy of its assets/ folder"
    )


def example_series_dir(name: str) -> Path:
    """The run directory of shipped series ``name`` (one of :data:`EXAMPLE_SERIES`)."""
    if name not in EXAMPLE_SERIES:
        raise ValueError(f"example series {name!r}: expected one of {list(EXAMPLE_SERIES)}")
    p = assets_dir() / "series" / name
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p}: no config.json; the example series {name!r} is missing or incomplete")
    return p


def example_series(name: str = "fade600to0"):
    """:func:`circuitfade.store.attach` of :func:`example_series_dir` ``(name)``."""
    from circuitfade.store.sources import attach

    return attach(example_series_dir(name))
