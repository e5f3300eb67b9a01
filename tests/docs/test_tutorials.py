"""The tutorial notebooks run top to bottom (nbclient, a real kernel) and produce what they claim.

Each test executes one notebook with a scratch folder *outside the repository* as working
directory (tutorials find the shipped series through the package, not the folder), then
runs one extra cell in the same kernel that reports the notebook's key results as
JSON, and checks them. Slow (each notebook trains or traces for up to a minute or two).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel  # noqa: E402
from repo_root import REPO  # noqa: E402

TUTORIALS = REPO / "tutorials"
NOTEBOOKS = ["01_fade_vs_unforced.ipynb", "02_trace_series.ipynb", "03_attach_your_model.ipynb",
             "05_no_partial_credit.ipynb"]
MARK = "TUTORIAL-CHECK "


def _kernel_python() -> str | None:
    """The interpreter the ``python3`` kernelspec starts (``python``/``python3`` -> this one)."""
    try:
        argv = KernelSpecManager().get_kernel_spec("python3").argv
    except NoSuchKernel:
        return None
    exe = argv[0]
    if exe in {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}:
        return sys.executable  # jupyter_client substitutes sys.executable for these
    return shutil.which(exe) or exe


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Make the ``python3`` kernel run this interpreter (with circuitfade installed).

    If the kernelspec already resolves to ``sys.executable`` nothing changes; otherwise a
    private kernelspec pinned to ``sys.executable`` is put first on ``JUPYTER_PATH``.
    """
    mp = pytest.MonkeyPatch()
    found = _kernel_python()
    if found is None or Path(found).resolve() != Path(sys.executable).resolve():
        spec = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (circuitfade tests)", "language": "python",
        }))
        mp.setenv("JUPYTER_PATH", str(spec.parent.parent))
    yield
    mp.undo()


def run_notebook(name: str, check_code: str, cleanup: str = "", cwd: Path | None = None) -> tuple[object, dict]:
    """Execute ``tutorials/name``, then a cell printing MARK + ``json.dumps(check_code)`` and then
    ``cleanup``, in the same kernel; return (executed notebook, the decoded report)."""
    nb = nbformat.read(TUTORIALS / name, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(f"import json as _json\nprint({MARK!r} + _json.dumps({check_code}))"))
    check_index = len(nb.cells) - 1
    if cleanup:
        nb.cells.append(nbformat.v4.new_code_cell(cleanup))
    cwd = Path(tempfile.mkdtemp(prefix="circuitfade_tutorial_")) if cwd is None else cwd
    assert REPO not in cwd.resolve().parents
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{name}: {out.get('ename')}: {out.get('evalue')}"
    text = "".join(o.get("text", "") for o in nb.cells[check_index].outputs if o.get("output_type") == "stream")
    line = next(l for l in text.splitlines() if l.startswith(MARK))
    return nb, json.loads(line[len(MARK):])


def _has_plotly_output(nb) -> bool:
    return any("application/vnd.plotly.v1+json" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_notebooks_are_clean_and_pin_threads():
    for name in NOTEBOOKS:
        nb = nbformat.read(TUTORIALS / name, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "torch.set_num_threads(1)" in code[0].source, name
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), f"{name} has outputs"


@pytest.mark.slow
@pytest.mark.numerics  # numbers from the shipped files or a trained run
def test_tutorial_01_fade_vs_unforced(kernel_env):
    nb, r = run_notebook(
        NOTEBOOKS[0],
        '{"rows": comparison.to_dict("records"), "steps": {p: run.step for p, run in runs.items()}, '
        '"full": {k: {c: float(v[c]) for c in ("step", "acc_zero")} for k, v in final.items()}}',
    )
    assert r["steps"] == {"unforced": 500, "fade60+45->0": 500}
    rows = {row["path"]: row for row in r["rows"]}
    assert set(rows) == {"unforced", "fade60+45->0"}
    # the fade run ends at gate 0, so zeroing the gates changes nothing
    assert rows["fade60+45->0"]["gate pos (mean)"] == 0.0
    assert rows["fade60+45->0"]["accuracy, gates zeroed"] == rows["fade60+45->0"]["accuracy, gates as trained"]
    for row in rows.values():
        assert 0.0 <= row["accuracy, gates zeroed"] <= 1.0
    assert {k: v["step"] for k, v in r["full"].items()} == {"unforced": 3600.0, "fade600to0": 3600.0}
    assert _has_plotly_output(nb)


@pytest.mark.slow
@pytest.mark.numerics  # numbers from the shipped files or a trained run
def test_tutorial_02_trace_series(kernel_env):
    nb, r = run_notebook(
        NOTEBOOKS[1],
        '{"steps": sorted(map(int, traced.step.unique())), "metrics": sorted(traced.metric.unique()), '
        '"timeline": timeline.astype(str).to_dict("records"), "gate_zero": series.gate_zero_step(), '
        '"source": str(series.source)}',
    )
    assert r["steps"] == list(range(0, 3601, 600))
    assert r["metrics"] == ["ablation_importance", "ablation_loss_increase", "successor_mass"]
    assert Path(r["source"]).resolve() == (REPO / "circuitfade" / "data" / "series" / "fade600to0").resolve()
    assert r["gate_zero"] == 1050  # fade600->0: 0.5 until 600, linear to 0 at 1050
    (row,) = r["timeline"]
    assert row["path"] == "fade600->0" and row["gate_zero_step"] == "1050"
    assert row["successor_mass_top_head"].startswith("L") and "H" in row["successor_mass_top_head"]
    assert _has_plotly_output(nb)


@pytest.mark.slow
@pytest.mark.numerics  # numbers from the shipped files or a trained run
def test_tutorial_03_attach_your_model(kernel_env):
    from circuitfade.compat import is_tl4

    nb, r = run_notebook(
        NOTEBOOKS[2],
        '{"files": sorted(p.name for p in folder.iterdir()), "steps": series.steps, '
        '"kind": type(series[0]).__name__, "n_rows": len(traced), "nan": int(traced.value.isna().sum()), '
        '"metrics": sorted(traced.metric.unique()), "heads": int(traced[["layer", "head"]].drop_duplicates().shape[0]), '
        '"loss": loss.item(), "final_mass": traced[(traced.metric == "successor_mass") & (traced.step == 300)]'
        '[["layer", "head", "value"]].astype(float).to_dict("records")}',
        cleanup="import shutil\nshutil.rmtree(folder)",  # the notebook's temporary checkpoint folder
    )
    assert r["files"] == ["ckpt_step0.pt", "ckpt_step100.pt", "ckpt_step200.pt", "ckpt_step300.pt", "config.json"]
    assert r["steps"] == [0, 100, 200, 300]
    assert r["kind"] == ("TransformerBridge" if is_tl4() else "HookedTransformer")  # the installed line's model
    assert r["metrics"] == ["ablation_importance", "ablation_loss_increase", "successor_mass"]
    assert r["heads"] == 8 and r["n_rows"] == 4 * 3 * 8 and r["nan"] == 0
    # the plain model learns the repeated spans: training loss far below chance, ln 31
    assert r["loss"] < 0.5 * math.log(31), r["loss"]
    # ... with an induction head: a layer-1 head puts most of its attention on the answer
    top = max(r["final_mass"], key=lambda row: row["value"])
    assert top["layer"] == 1 and top["value"] > 0.5, r["final_mass"]
    assert _has_plotly_output(nb)


@pytest.mark.slow
def test_tutorial_05_no_partial_credit(kernel_env):
    nb, r = run_notebook(
        "05_no_partial_credit.ipynb",
        '{"strict": [bool(torch.all(t == 1 / 3)) for t in strict.values()], '
        '"hand": hand_ablation[["kind", "retained"]].to_dict("records"), "ignition": ignition, '
        '"trained": trained_ablation[["kind", "retained"]].to_dict("records"), "after": after, "wait": wait}',
    )
    assert r["strict"] == [True] * 4
    assert [row["kind"] for row in r["hand"]] == ["part"] * 3 + ["random"] * 2
    assert all(abs(row["retained"]) < 0.15 for row in r["hand"][:3]) and all(row["retained"] == 1.0 for row in r["hand"][3:])
    assert r["ignition"] is not None and 0 < r["ignition"] < 600
    assert all(abs(row["retained"]) < 0.25 for row in r["trained"][:3])  # no partial credit in the trained circuit
    assert abs(r["after"] - 1 / 3) < 0.1 and r["wait"] is not None and r["wait"] > 0
    assert _has_plotly_output(nb)


# ------------------------------------------------------------------ the shipped series
def test_example_series_found_from_any_folder_and_by_env_var(tmp_path, monkeypatch):
    from circuitfade.store.examples import ENV_VAR, example_series, example_series_dir

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)  # not the repository
    assert example_series_dir("fade600to0") == REPO / "circuitfade" / "data" / "series" / "fade600to0"
    assert example_series("unforced").steps[-1] == 3600
    copy = tmp_path / "my_assets"
    shutil.copytree(REPO / "circuitfade" / "data" / "series" / "unforced", copy / "series" / "unforced")
    monkeypatch.setenv(ENV_VAR, str(copy))
    assert example_series_dir("unforced") == copy / "series" / "unforced"
    with pytest.raises(FileNotFoundError, match="fade600to0"):
        example_series_dir("fade600to0")  # not in that copy
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="expected a folder holding series/"):
        example_series_dir("unforced")
    with pytest.raises(ValueError, match="expected one of"):
        example_series_dir("nope")
