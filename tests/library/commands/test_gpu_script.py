"""``benchmarks/gpu.py``, the prepared GPU measurement: every code path runs on a CPU, an absent
device stops it in one line, and the paper part reports what the study wrote."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from repo_root import REPO

SCRIPT = REPO / "benchmarks" / "gpu.py"


def _load():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return gpu


@pytest.mark.slow
def test_every_part_but_the_paper_runs_on_the_cpu_and_names_the_machine(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "4", "--eval-every", "2",
                           "--checkpoint-every", "4", "--sizes", "1,2", "--paper", "skip", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["single"]["device"]["status"] == ["done"] and res["single"]["cpu"]["status"] == ["done"]
    assert sorted(res["ensemble"]) == ["1", "2"] and res["ensemble"]["2"]["status"] == ["done", "done"]
    assert res["ensemble"]["2"]["runs_per_hour"] == pytest.approx(7200 / res["ensemble"]["2"]["wall_s"])
    md = out.with_suffix(".md").read_text()
    assert "| ensemble of 2 |" in md and "paper's seeds" not in md
    assert md.rstrip().splitlines()[-1].startswith("Machine: ") and res["machine"]["cpu"] in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: no absent device to refuse")
def test_an_absent_device_stops_it_in_one_line_before_any_work(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 1 and "CUDA is not available" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_paper_part_reports_the_studys_runs_and_verdicts(tmp_path, monkeypatch):
    """The study's own files (planted: what reproduce writes) give the counts; its command carries
    the device, the ensemble size and the workers; a failed study is an error, not a figure."""
    gpu = _load()
    seen = {}

    def reproduce(cmd, **kw):
        seen["cmd"] = cmd
        folder = cmd[cmd.index("--out") + 1]
        with open(f"{folder}/results_runs.csv", "w") as f:
            f.write("run,status\na,done\nb,done\nc,failed\n")
        with open(f"{folder}/verdicts.csv", "w") as f:
            f.write("id,verdict\nx,reproduced\ny,partly\nz,reproduced\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpu.subprocess, "run", reproduce)
    args = argparse.Namespace(device="cuda", paper="quick", paper_ensemble_size=64, paper_workers=2)
    p = gpu.paper(args)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[cmd.index("--ensemble-size") + 1] == "64"
    assert cmd[cmd.index("--workers") + 1] == "2" and "--quick" in cmd and "--executor" in cmd
    assert p["runs"] == 3 and p["status"] == {"done": 2, "failed": 1}
    assert p["verdicts"] == {"reproduced": 2, "partly": 1} and "TMP" in p["command"]
    md = gpu.markdown({"command": "c", "steps": 1, "eval_every": 1, "checkpoint_every": 1, "device": "cuda",
                       "parts": ["paper"], "paper": p})
    assert "3 runs" in md and "1 failed" in md and "2 reproduced" in md

    monkeypatch.setattr(gpu.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 2, "", "boom"))
    with pytest.raises(RuntimeError, match="exit code 2"):
        gpu.paper(args)
