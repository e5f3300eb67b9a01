"""mkdocs hook: the PNG figures under ``results/`` and ``assets/figures/`` become files of the site.

Measured results live in ``results/`` beside the docs, never copied into ``docs/``. The text is
included with snippets; this hook adds every ``results/**/*.png`` to the site at the same
relative path (``results/benchmarks/ensemble.png``), so a page shows a generated figure with
``![...](results/benchmarks/ensemble.png)`` (from a page in a subfolder, ``../results/...``) and
``mkdocs build --strict`` checks that the figure exists. The guide's figures drawn from the shipped
series (``assets/make_assets.py``) are added the same way, at ``assets/figures/NAME.png``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config, **kwargs):
    """``files`` with every PNG under ``results/`` and ``assets/figures/`` added (source: the repository root)."""
    for png in sorted([*(ROOT / "results").rglob("*.png"), *(ROOT / "assets" / "figures").glob("*.png")]):
        files.append(File(png.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                          config["use_directory_urls"]))
    return files
