"""A run resumes only from files that are what they say they are.

"Partial R" below is a finished tiny run (checkpoints 0, 5, 10) with step 10 and
``done.json`` removed, so the trainer resumes from step 5. Each test plants one lie in a
copy of it (a file under another step's name, a missing or garbage tensor, another dtype,
flipped bytes, NaN weights, an unreadable file, a second file for one step) and checks
that the trainer refuses with one line naming the file, trains nothing, overwrites
nothing and records no failure. The clean copies (with and without checksums) still
resume to the uninterrupted run's bytes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import circuitfade.train.rundir as rundir
from circuitfade.io import CHECKSUM_KEY, CheckpointError, save_tensors, verify_checksum
from circuitfade.train import RunConfig, TrainConfig, fit, new_run, train
from circuitfade.train.config import checkpoint_steps, is_checkpoint_step
from circuitfade.train.checkpoints import complete_checkpoints

CFG = RunConfig(path="fade3+3->0", seed=5,
                train=TrainConfig(steps=10, eval_every=5, checkpoint_every=5, eval_size=32, batch_size=8))


def ck(d: Path, step: int, state: bool = False) -> Path:
    return d / "checkpoints" / f"step_{step:06d}{'.state' if state else ''}.safetensors"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("R") / "R"
    train(CFG, d, progress=False)
    return d


@pytest.fixture()
def partial(finished, tmp_path) -> Path:
    d = tmp_path / "R"
    shutil.copytree(finished, d)
    ck(d, 10).unlink()
    ck(d, 10, state=True).unlink()
    (d / "done.json").unlink()
    return d


def read(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def rewrite(path: Path, tensors: dict, meta: dict, *, checksum: bool) -> None:
    """Write ``tensors``/``meta`` to ``path``: with a fresh, valid checksum (as this package's
    writer would), or without one (as another tool would)."""
    if checksum:
        save_tensors(path, tensors, metadata=meta)
    else:
        save_file(tensors, str(path), metadata={k: v for k, v in meta.items() if k != CHECKSUM_KEY})


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".lock"}


def refused(d: Path, *words: str) -> str:
    """Resuming ``d`` fails with one line containing ``words``; nothing is trained or written."""
    before = snapshot(d)
    with pytest.raises(CheckpointError) as e:
        train(CFG, d, progress=False)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    assert snapshot(d) == before  # nothing overwritten, nothing added (no failed.json, no done.json)
    return msg


# --------------------------------------------------------------------------------------
# the clean cases stay clean
# --------------------------------------------------------------------------------------
def test_partial_run_resumes_to_the_uninterrupted_bytes(finished, partial):
    train(CFG, partial, progress=False)
    assert ck(partial, 10).read_bytes() == ck(finished, 10).read_bytes()
    assert ck(partial, 10, True).read_bytes() == ck(finished, 10, True).read_bytes()
    assert verify_checksum(ck(partial, 10)) and verify_checksum(ck(partial, 10, True))


def test_files_without_checksums_still_resume(finished, partial):
    """Checkpoints written before checksums (no ``checksum``/``weights_checksum`` metadata)
    get every other check and resume."""
    for state in (False, True):
        t, m = read(ck(partial, 5, state))
        m.pop("weights_checksum", None)
        rewrite(ck(partial, 5, state), t, m, checksum=False)
        assert verify_checksum(ck(partial, 5, state)) is False
    train(CFG, partial, progress=False)
    assert ck(partial, 10).read_bytes() == ck(finished, 10).read_bytes()


# --------------------------------------------------------------------------------------
# a name, two step records and the keys must agree
# --------------------------------------------------------------------------------------
def test_state_file_of_another_step_under_this_name_is_refused(partial):
    shutil.copy(ck(partial, 0, True), ck(partial, 5, True))
    refused(partial, "step_000005.state.safetensors", "records step '0'", "step 5")


def test_weights_of_another_step_under_this_name_are_refused(partial):
    shutil.copy(ck(partial, 0), ck(partial, 5))
    refused(partial, "step_000005.safetensors", "records step '0'")


@pytest.mark.parametrize("which", ["weights", "state"])
def test_missing_step_metadata_is_refused(partial, which):
    f = ck(partial, 5, which == "state")
    t, m = read(f)
    del m["step"]
    rewrite(f, t, m, checksum=False)
    refused(partial, f.name, "records no step")


def test_state_without_optimizer_tensors_of_one_parameter_is_refused(partial):
    f = ck(partial, 5, True)
    t, m = read(f)
    t = {k: v for k, v in t.items() if not k.startswith("optim.0.")}
    rewrite(f, t, m, checksum=False)  # no checksum to vouch for it: the completeness rule catches it
    refused(partial, f.name, "no optimizer state", "[0]")


def test_state_with_tensors_removed_under_its_old_checksum_is_refused(partial):
    f = ck(partial, 5, True)
    t, m = read(f)
    save_file({k: v for k, v in t.items() if not k.startswith("optim.0.")}, str(f), metadata=m)  # checksum kept
    refused(partial, f.name, "checksum mismatch")


def test_state_written_with_other_weights_is_refused(partial):
    f = ck(partial, 5)
    t, m = read(f)
    t = {k: (v + 1e-3 if v.is_floating_point() and torch.isfinite(v).all() else v) for k, v in t.items()}
    rewrite(f, t, m, checksum=True)  # a valid weights file of step 5 on its own
    refused(partial, "step_000005.state.safetensors", "other weights")


def test_two_files_for_one_step_are_refused(partial):
    shutil.copy(ck(partial, 5), partial / "checkpoints" / "step_5.safetensors")
    with pytest.raises(CheckpointError, match=r"two files for step 5: step_000005\.safetensors and step_5\.safetensors"):
        complete_checkpoints(partial)
    refused(partial, "two files for step 5")


def test_a_stray_pair_under_other_names_is_named(partial):
    for state in (False, True):
        shutil.copy(ck(partial, 5, state), partial / "checkpoints" / f"step_7{'.state' if state else ''}.safetensors")
    refused(partial, "step_7.safetensors", "step_000007.safetensors")


def test_a_checkpoint_past_the_runs_end_is_refused(partial):
    for state in (False, True):
        shutil.copy(ck(partial, 5, state), ck(partial, 40, state))
    refused(partial, "step_000040.safetensors", "past the run's end")


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64, torch.float16])
def test_weights_in_another_dtype_are_refused(partial, dtype):
    f = ck(partial, 5)
    t, m = read(f)
    rewrite(f, {k: v.to(dtype) if v.is_floating_point() else v for k, v in t.items()}, m, checksum=True)
    refused(partial, f.name, "dtype mismatch", str(dtype).removeprefix("torch."))


# --------------------------------------------------------------------------------------
# corrupt state: one line naming the file; never recorded as a divergence
# --------------------------------------------------------------------------------------
def _group_edit(meta: dict, **settings) -> str:
    """``param_groups`` metadata with ``settings`` changed in every group (as JSON)."""
    import json

    return json.dumps([{**g, **settings} for g in json.loads(meta["param_groups"])])


@pytest.mark.parametrize("edit, words", [
    (lambda t, m: t.pop("rng.data"), ["missing tensor rng.data"]),
    (lambda t, m: t.update({"rng.data": torch.rand(7)}), ["rng.data", "not a generator state"]),
    (lambda t, m: t.update({"rng.dropout": torch.zeros(16, dtype=torch.uint8)}), ["rng.dropout"]),
    (lambda t, m: m.update(metrics="[{not json"), ["'metrics' metadata is not valid JSON"]),
    (lambda t, m: m.update(format="something else"), ["not a circuitfade state file"]),
    (lambda t, m: t.update({"optim.0.exp_avg": torch.zeros(3, 3)}), ["optim.0.exp_avg", "shape"]),
    (lambda t, m: t.update({"optim.0.exp_avg": torch.full_like(t["optim.0.exp_avg"], float("nan"))}),
     ["optim.0.exp_avg", "non-finite"]),
    (lambda t, m: t.update({"optim.0.step": torch.tensor(99.0)}), ["optim.0.step", "[1, 5]"]),
    (lambda t, m: t.update({"optim.999.step": torch.tensor(1.0)}), ["optim.999.step"]),
    (lambda t, m: t.update({"stray": torch.zeros(1)}), ["stray"]),
    (lambda t, m: m.update(param_groups="[]"), ["param_groups"]),
    # the invariants AdamW keeps: a second moment never below 0, the settings the config makes
    (lambda t, m: t.update({"optim.0.exp_avg_sq": -t["optim.0.exp_avg_sq"] - 1.0}),
     ["optim.0.exp_avg_sq", "negative"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, maximize=True)), ["maximize", "True"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, betas=[0, 0])), ["betas", "[0, 0]"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, eps=0.5)), ["eps", "0.5"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, amsgrad=True)), ["amsgrad"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, weight_decay=-1.0)), ["weight_decay", "-1.0"]),
    (lambda t, m: m.update(param_groups=_group_edit(m, lr=float("nan"))), ["lr", "nan"]),
])
@pytest.mark.parametrize("checksum", [True, False])
def test_corrupt_state_is_one_line_naming_the_file(partial, edit, words, checksum):
    f = ck(partial, 5, True)
    t, m = read(f)
    edit(t, m)
    rewrite(f, t, m, checksum=checksum)  # even with a valid checksum: the content itself is checked
    refused(partial, f.name, *words)


def test_a_negative_second_moment_without_checksums_is_corrupt_not_a_divergence(partial):
    """A state file written without checksums whose ``exp_avg_sq`` is negative passes the finite
    check; resumed, AdamW would take the square root of it and the run would be recorded diverged."""
    for state in (False, True):
        t, m = read(ck(partial, 5, state))
        m.pop("weights_checksum", None)
        if state:
            t["optim.3.exp_avg_sq"] = -t["optim.3.exp_avg_sq"].abs() - 1.0
        rewrite(ck(partial, 5, state), t, m, checksum=False)
    refused(partial, "step_000005.state.safetensors", "optim.3.exp_avg_sq", "negative")
    assert not (partial / "failed.json").exists()


def test_weights_with_only_their_checksum_removed_are_named_as_altered(partial):
    f = ck(partial, 5)
    t, m = read(f)
    rewrite(f, t, m, checksum=False)  # the same tensors; the state file still records their checksum
    msg = refused(partial, f.name, "records no checksum", "altered")
    assert "other weights" not in msg


def test_nan_weights_are_a_corrupt_input_not_a_divergence(partial):
    f = ck(partial, 5)
    t, m = read(f)
    t["blocks.0.attn.W_Q"] = torch.full_like(t["blocks.0.attn.W_Q"], float("nan"))
    rewrite(f, t, m, checksum=True)
    refused(partial, f.name, "blocks.0.attn.W_Q", "non-finite", "not a diverged run")
    assert not (partial / "failed.json").exists()


def test_unreadable_checkpoint_is_reported_as_permission_denied(partial, monkeypatch):
    target = ck(partial, 5)
    real_open = open

    def guarded_open(path, *a, **k):
        if Path(path) == target:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(rundir, "open", guarded_open, raising=False)
    msg = refused(partial, "step_000005.safetensors", "permission denied")
    assert "not found" not in msg


# --------------------------------------------------------------------------------------
# checksums: flipped bytes are caught
# --------------------------------------------------------------------------------------
def _flip_first_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    data[8 + n] ^= 0x01  # lowest bit of the first tensor byte: the values stay finite
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("state", [False, True])
def test_flipped_bit_in_tensor_data_is_caught(partial, state):
    f = ck(partial, 5, state)
    assert verify_checksum(f) is True
    _flip_first_data_byte(f)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        verify_checksum(f)
    msg = refused(partial, f.name)
    assert "checksum mismatch" in msg or "step count" in msg  # (a flipped step count is refused as such)


def test_verify_checksum_says_when_a_file_has_none(tmp_path):
    f = tmp_path / "plain.safetensors"
    save_file({"a": torch.ones(2)}, str(f))
    assert verify_checksum(f) is False
    g = save_tensors(tmp_path / "ours.safetensors", {"a": torch.ones(2)}, metadata={"step": "3"})
    assert verify_checksum(g) is True
    t, m = read(g)
    save_file(t, str(g), metadata={**m, "step": "4"})  # metadata is covered too
    with pytest.raises(CheckpointError, match="ours.safetensors.*checksum mismatch"):
        verify_checksum(g)


# --------------------------------------------------------------------------------------
# a huge --steps is computed, never enumerated
# --------------------------------------------------------------------------------------
def test_a_trillion_steps_cost_nothing_to_configure_or_checkpoint(tmp_path):
    t0 = time.perf_counter()
    tc = TrainConfig(steps=10**12, eval_every=10**6, checkpoint_every=300, eval_size=16, batch_size=4)
    cfg = RunConfig(path="fade600->0", train=tc)
    answers = [is_checkpoint_step(tc, s) for s in (0, 1, 300, 301, 10**12 - 1, 10**12, 10**12 + 1)]
    assert answers == [True, False, True, False, False, True, False]
    assert is_checkpoint_step(TrainConfig(steps=10**12, extra_checkpoints=(7,)), 7)
    assert time.perf_counter() - t0 < 5.0  # enumerating 3.3e9 steps takes minutes or a MemoryError
    with pytest.raises(ValueError, match="limit"):
        checkpoint_steps(tc)
    run = fit(new_run(cfg), until=2, run_dir=tmp_path / "r", progress=False)  # the trainer's own checks
    assert run.step == 2 and [p.name for p in sorted((tmp_path / "r" / "checkpoints").iterdir())] == [
        "step_000000.safetensors", "step_000000.state.safetensors"]
