"""The shipped example series, found from any working folder, in a clone or a pip install.

    from circuitfade.store.examples import example_series
    series = example_series("fade600to0")          # a CheckpointSeries, 13 checkpoints, steps 0..3600

The two series (``unforced``, ``fade600to0``: seed 0, associative recall, 3,600 steps, weights
every 300 steps; 4.6 MB) ship inside the package (``circuitfade/data/series/``), so a
``pip install`` has them. ``$CIRCUITFADE_ASSETS/series/<name>`` (a folder holding ``series/``)
takes precedence when set, e.g. to try regenerated series (``assets/make_assets.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["EXAMPLE_SERIES", "ENV_VAR", "assets_dir", "example_series_dir", "example_series"]

EXAMPLE_SERIES = ("unforced", "fade600to0")
"""Names of the shipped series (seed 0, associative recall, 3,600 steps, weights every 300)."""
ENV_VAR = "CIRCUITFADE_ASSETS"


def assets_dir() -> Path:
    """The folder holding ``series/``: ``$CIRCUITFADE_ASSETS`` if set, else the package's own ``data/``."""
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if not (p / "series").is_dir():
            raise FileNotFoundError(f"{ENV_VAR}={env}: expected a folder holding series/ (e.g. circuitfade/data)")
        return p
    p = Path(__file__).resolve().parents[1] / "data"
    if (p / "series").is_dir():
        return p
    raise FileNotFoundError(f"{p / 'series'}: the example series are missing from this installation; reinstall "
                            f"circuitfade or set {ENV_VAR} to a folder holding series/")


def example_series_dir(name: str) -> Path:
    """The run directory of shipped series ``name`` (one of :data:`EXAMPLE_SERIES`)."""
    if name not in EXAMPLE_SERIES:
        raise ValueError(f"example series {name!r}: expected one of {list(EXAMPLE_SERIES)}")
    from circuitfade.train.rundir import RunDir  # here: this module stays cheap to import

    p = assets_dir() / "series" / name
    if not RunDir(p).has_config():
        raise FileNotFoundError(f"{p}: no config.json; the example series {name!r} is missing or incomplete")
    return p


def example_series(name: str = "fade600to0"):
    """:func:`circuitfade.store.attach` of :func:`example_series_dir` ``(name)``."""
    from circuitfade.store.sources import attach

    return attach(example_series_dir(name))
