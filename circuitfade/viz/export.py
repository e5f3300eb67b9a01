"""Writing figures to files: :func:`save` (HTML always; PNG / SVG / PDF / JPEG / WebP through
an image exporter), :func:`save_figure` (HTML plus a PNG that may fail without failing the
caller), and what they need: :func:`static_figure` (a figure as it reads on paper),
:func:`image_exporter` (kaleido, probed once), :class:`ExportError`, and
:func:`use_exportable_renderer` (figures in a Jupyter kernel that survive notebook export).

``circuitfade.plots.save`` is the same function as :func:`save` (the figures module offers it
beside the figures it writes). Image export needs ``pip install 'circuitfade[figures]'``
(kaleido 0.2.1, which bundles its own headless Chromium and needs no network); kaleido >= 1
also works where Chrome is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from circuitfade.viz.panels import panel_grid

__all__ = [
    "save",
    "save_figure",
    "static_figure",
    "image_exporter",
    "ExportError",
    "use_exportable_renderer",
    "EXPORTABLE_RENDERER",
    "IMAGE_FORMATS",
    "EXPORTER_HINT",
]


# ------------------------------------------------------------------------------ notebooks
EXPORTABLE_RENDERER = "plotly_mimetype+notebook"
"""The renderer :func:`use_exportable_renderer` sets in a Jupyter kernel: plotly's own MIME
bundle (JupyterLab, VS Code) plus an HTML copy of each figure with plotly.js embedded once per
notebook, so a figure survives ``jupyter nbconvert --to html`` and renders offline."""


def use_exportable_renderer() -> str | None:
    """Make figures in a Jupyter kernel survive export, unless a renderer was chosen.

    In a Jupyter kernel plotly picks ``"plotly_mimetype"``, a MIME bundle that only a live
    Jupyter front end draws: ``jupyter nbconvert --to html`` (and GitHub's notebook view) show
    no figure. When ``plotly.io.renderers.default`` is exactly that pick and the
    ``PLOTLY_RENDERER`` environment variable is unset, this sets :data:`EXPORTABLE_RENDERER`
    and returns it; any other renderer (one the user set, or plotly's pick for Colab, VS Code,
    Kaggle, a terminal) is kept and ``None`` returned. Called when :mod:`circuitfade.viz` is
    imported inside a Jupyter kernel; a renderer set afterwards wins.
    """
    import plotly.io as pio

    if os.environ.get("PLOTLY_RENDERER") or pio.renderers.default != "plotly_mimetype":
        return None
    pio.renderers.default = EXPORTABLE_RENDERER
    return EXPORTABLE_RENDERER


# ------------------------------------------------------------------------------ saving
class ExportError(RuntimeError):
    """No image exporter can write the requested format (the message says how to get one)."""


IMAGE_FORMATS = ("png", "svg", "pdf", "jpeg", "webp")
EXPORTER_HINT = ("pip install 'circuitfade[figures]' (kaleido==0.2.1: bundles its own Chromium, works offline); "
                 "or save as .html, which always works")
_EXPORTER: dict = {}


HANG_SECONDS = 120.0
"""How long an export in this process waits for kaleido 0.2's browser before taking it as hung."""
HANG_TRIES = 3
"""How many times an export in this process is tried, each in a fresh browser, before :class:`ExportError`."""


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), read from ``/proc`` (``[]`` elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _kill_tree(proc) -> None:
    """SIGKILL ``proc`` (a ``subprocess.Popen``) and every process below it: a blocked read of its
    pipe then ends (kaleido 0.2 runs its browser under a shell script that keeps the pipe open)."""
    import contextlib
    import signal

    if proc is None or proc.poll() is not None:
        return
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _unless_hung(call, process, seconds: float, tries: int):
    """``call()`` in this thread; when it has not returned after ``seconds``, the process tree of
    ``process()`` is killed (its pipe closes, so the call fails instead of waiting for ever) and
    ``call`` is tried again, up to ``tries`` times in all; then :class:`ExportError`."""
    import threading

    for _ in range(tries):
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            _kill_tree(process())

        timer = threading.Timer(seconds, kill)
        timer.daemon = True
        timer.start()
        try:
            return call()
        except Exception:
            if not hung.is_set():
                raise
        finally:
            timer.cancel()
    raise ExportError(f"the image exporter's browser did not answer within {seconds:g} s, {tries} times")


def _kaleido_v0():
    """kaleido 0.2.x's plotly scope, fed plotly's own plotly.js (so it never reaches for a CDN); an
    export whose browser does not answer within :data:`HANG_SECONDS` is tried again in a fresh one
    (kaleido 0.2's Chromium sometimes never answers)."""
    import plotly
    from kaleido.scopes.plotly import PlotlyScope

    js = Path(os.path.dirname(plotly.__file__)) / "package_data" / "plotly.min.js"
    scope = PlotlyScope(plotlyjs=str(js) if js.is_file() else None, mathjax=False)

    def export(fig: go.Figure, fmt: str, width: int, height: int, scale: float) -> bytes:
        data = json.loads(fig.to_json())
        return _unless_hung(lambda: scope.transform(data, format=fmt, width=width, height=height, scale=scale),
                            lambda: getattr(scope, "_proc", None), HANG_SECONDS, HANG_TRIES)

    return export


def _kaleido_v1():
    """plotly's own ``to_image`` (kaleido >= 1, which drives an installed Chrome)."""
    import kaleido  # noqa: F401
    import plotly.io as pio

    def export(fig: go.Figure, fmt: str, width: int, height: int, scale: float) -> bytes:
        return pio.to_image(fig, format=fmt, width=width, height=height, scale=scale)

    return export


def image_exporter():
    """``(export, None)`` where ``export(fig, fmt, width, height, scale) -> bytes`` works here,
    else ``(None, reason)``. Probed once per process with a one-bar figure, so a missing
    browser fails here, with its reason, rather than in the middle of a report."""
    if "result" not in _EXPORTER:
        reasons = []
        for name, make in (("kaleido 0.2", _kaleido_v0), ("kaleido >= 1", _kaleido_v1)):
            try:
                export = make()
                export(go.Figure(go.Bar(y=[1])), "png", 60, 40, 1)
            except Exception as e:  # noqa: BLE001 - every failure is a reason to try the next one
                reasons.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
                continue
            _EXPORTER["result"] = (export, None)
            break
        else:
            _EXPORTER["result"] = (None, "; ".join(reasons))
    return _EXPORTER["result"]


_CHILD_EXPORT = """
import sys
import plotly.io as pio
from circuitfade.viz.export import save
save(pio.read_json(sys.argv[1]), sys.argv[2], width=int(sys.argv[3]), height=int(sys.argv[4]), scale=float(sys.argv[5]))
"""


def _export_in_child(fig: go.Figure, path: Path, w: int, h: int, scale: float, timeout: float,
                     retries: int) -> bytes:
    """Export in a child process that is killed (with the browser it started) after ``timeout`` s,
    and tried again in a fresh child up to ``retries`` times: kaleido 0.2's headless Chromium
    sometimes never answers (a race in its pipe to Python, more frequent on a loaded machine),
    and a fresh browser does not inherit the hang."""
    import contextlib
    import signal
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst, log = Path(tmp) / "fig.json", Path(tmp) / ("fig" + path.suffix), Path(tmp) / "stderr.txt"
        src.write_text(fig.to_json())
        for _ in range(retries + 1):
            # stderr to a file, not a pipe: a browser that escaped the kill would hold a pipe open for ever
            with open(log, "wb") as err_file:
                proc = subprocess.Popen([sys.executable, "-c", _CHILD_EXPORT, str(src), str(dst), str(w), str(h),
                                         str(scale)], start_new_session=True, stdout=subprocess.DEVNULL,
                                        stderr=err_file)
                try:
                    proc.wait(timeout=timeout)
                    break
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
        else:
            tries = f" ({retries + 1} tries)" if retries else ""
            raise ExportError(f"cannot write {path}: the image exporter did not finish within {timeout:g} s{tries}")
        if proc.returncode != 0:
            err = log.read_bytes()
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["failed"]
            raise ExportError(f"cannot write {path}: {last[0]}")
        return dst.read_bytes()


def save(fig: go.Figure, path: str | os.PathLike, *, width: int | None = None, height: int | None = None,
         scale: float = 1.0, plotlyjs: str = "embed", timeout: float | None = None, retries: int = 2) -> Path:
    """Write ``fig`` to ``path``, the format taken from its suffix; returns the path.

    * ``.html``: always works; plotly.js embedded (``plotlyjs="embed"``, offline, ~4.8 MB)
      or loaded from its CDN (``plotlyjs="cdn"``);
    * ``.png``, ``.svg``, ``.pdf``, ``.jpeg``, ``.webp``: :func:`static_figure` of ``fig``
      (a slider heatmap becomes the small multiples of all its steps) through
      :func:`image_exporter`, ``width`` (default 900) x ``height`` (default
      ``fig.layout.height`` or 450) pixels times ``scale``. Without a working exporter: :class:`ExportError` saying how to
      install one (``pip install 'circuitfade[figures]'``). With ``timeout`` (seconds) the
      export runs in a child process that is killed after that long and tried again in a fresh
      one up to ``retries`` times (then an :class:`ExportError`), for batch jobs on loaded
      machines where the exporter's browser can hang.

    Folders are created; the file is written atomically (an existing one is replaced).
    """
    from circuitfade.io import atomic_write

    if not isinstance(fig, go.Figure):
        raise ValueError(f"fig: expected a plotly go.Figure, got {type(fig).__name__}")
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    fmt = "jpeg" if fmt == "jpg" else fmt
    if fmt in ("html", "htm"):
        if plotlyjs not in ("embed", "cdn"):
            raise ValueError(f"plotlyjs: expected 'embed' or 'cdn', got {plotlyjs!r}")
        text = fig.to_html(include_plotlyjs=True if plotlyjs == "embed" else "cdn", full_html=True)
        return atomic_write(path, text.encode("utf-8"))
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"{path}: unknown figure format {path.suffix!r}; expected .html or one of "
                         + ", ".join("." + f for f in IMAGE_FORMATS))
    fig = static_figure(fig)
    w = int(width or fig.layout.width or 900)
    h = int(height or fig.layout.height or 450)
    if timeout is not None:
        if not timeout > 0 or int(retries) != retries or retries < 0:
            raise ValueError(f"timeout must be > 0 s and retries a whole number >= 0, got {timeout!r} and {retries!r}")
        return atomic_write(path, _export_in_child(fig, path, w, h, float(scale), float(timeout), int(retries)))
    export, why = image_exporter()
    if export is None:
        raise ExportError(f"cannot write {path}: no image exporter works here ({why}). {EXPORTER_HINT}")
    return atomic_write(path, export(fig, fmt, w, h, float(scale)))


def static_figure(fig: go.Figure) -> go.Figure:
    """``fig`` as it reads on paper (what :func:`save` exports to PNG/SVG/PDF).

    A :func:`~circuitfade.viz.plots.head_heatmap` with a step slider shows one step at a
    time, which a static image would reduce to the visible (last) step: it becomes the
    small-multiples grid of every step (as :func:`~circuitfade.viz.plots.head_small_multiples`,
    same colour scale). Any other figure with a slider or buttons is returned as it is, with a
    ``UserWarning`` that only its visible state is exported. Figures without them are
    returned unchanged.
    """
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    if meta.get("kind") == "head_heatmap" and len(fig.data) > 1:
        panels = [(tr.name, np.asarray(tr.z, dtype=float), tr.text) for tr in fig.data]
        n_layers, n_heads = panels[0][1].shape
        ca = fig.layout.coloraxis
        return panel_grid(panels, n_layers, n_heads, meta.get("label", ""), (ca.cmin, ca.cmax))
    if fig.layout.sliders or fig.layout.updatemenus:
        import warnings

        warnings.warn("this figure has a slider or buttons; a static image shows only its visible state "
                      "(save it as .html to keep them)", UserWarning, stacklevel=3)
    return fig

def save_figure(fig: go.Figure, stem: str | os.PathLike, *, png: bool = True, timeout: float = 180.0) -> list[str]:
    """Write ``stem.html`` (plotly.js from its CDN) always, and ``stem.png`` when ``png`` through
    :func:`save` with a ``timeout``; a failed or hung PNG export is printed and the figure stays
    HTML only. Returns the names written (for result files that list their figures)."""
    stem = Path(stem)
    html, out_png = stem.with_suffix(".html"), stem.with_suffix(".png")
    save(fig, html, plotlyjs="cdn")
    written = [html.name]
    if png:
        try:
            save(fig, out_png, timeout=timeout)
            written.append(out_png.name)
        except ExportError as e:
            print(f"PNG export skipped for {stem.name}: {e}")
    return written
