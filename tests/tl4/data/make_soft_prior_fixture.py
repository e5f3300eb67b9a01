"""Writes the soft-prior fixtures for tests/tl4/test_soft_prior_lines.py, on TransformerLens 3.9:

* ``soft_prior_39.safetensors`` / ``soft_prior_39.json``: for every case of
  ``tests/tl4/soft_prior_cases.py`` the config JSON, the weights right after
  ``torch.manual_seed(11)`` initialisation, the perturbed weights the outputs use, the
  inputs, logits and gradients on the fused, hooked and answer-position paths, the
  logits with every gate at zero, the state-dict names in order, and the hook names and
  shapes of ``run_with_cache``;
* ``run39/``: a tiny training run directory (24 steps, checkpoints at 0, 12 and 24);
* ``run200_39_metrics.csv``: ``metrics.csv`` of the 200-step base-model run.

Run with TransformerLens 3.9 (the default environment), from the repository root:
``python tests/tl4/data/make_soft_prior_fixture.py``.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/tl4: soft_prior_cases

import soft_prior_cases as C  # noqa: E402

from circuitfade import compat  # noqa: E402
from circuitfade.io import save_tensors, write_json  # noqa: E402
from circuitfade.train import RunConfig, train  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    assert not compat.is_tl4(), "write the fixture on TransformerLens 3.9"
    tensors, meta = {}, {"transformer_lens": compat.tl_version(), "torch": torch.__version__, "cases": {}}
    for name in C.CASES:
        model = C.build(name)
        for k, v in model.state_dict().items():
            tensors[f"{name}/init/{k}"] = v.clone()
        C.perturb(model)
        for k, v in model.state_dict().items():
            tensors[f"{name}/weights/{k}"] = v.clone()
        x = C.inputs(model)
        tensors[f"{name}/inputs"] = x
        for k, v in C.outputs(model, x).items():
            tensors[f"{name}/{k}"] = v
        meta["cases"][name] = {"config": model.cfg.to_json_dict(), "state_dict_keys": list(model.state_dict()),
                               "hooks": C.hook_shapes(model, x)}
    save_tensors(HERE / "soft_prior_39.safetensors", tensors)
    write_json(HERE / "soft_prior_39.json", meta)

    run = HERE / "run39"
    shutil.rmtree(run, ignore_errors=True)
    train(RunConfig(**C.RUN_CONFIG), run, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        train(RunConfig(**C.RUN200_CONFIG), Path(tmp) / "run", progress=False)
        shutil.copy(Path(tmp) / "run" / "metrics.csv", HERE / "run200_39_metrics.csv")
    print(f"{len(tensors)} tensors, {len(meta['cases'])} cases")
