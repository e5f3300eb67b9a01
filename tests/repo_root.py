"""Where the repository and its tests are, for every test file whichever folder under ``tests/``
it sits in (``tests/conftest.py`` puts this folder on ``sys.path``): ``from repo_root import REPO``
instead of counting parents of ``__file__``."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""``tests/``: the shared helpers (``planted``, ``planted_jobs``, ``tolerances``, this module)."""
REPO = TESTS.parent
"""The repository root: ``circuitfade/``, ``studies/``, ``docs/``, ``results/``."""
