"""A TransformerLens 3.9 config saved beside one's own checkpoints attaches on either line.

``data/ht39_config.json`` is ``json.dump(cfg.to_dict(), f, default=str)`` written by
TransformerLens 3.9 (data/make_ht39_config.py) for the model of ``data/ht39_ln_mlp.safetensors``:
87 fields, 19 of which TransformerLens 4.x's ``TransformerBridgeConfig`` does not have (all at
their 3.9 defaults here). On either line the checkpoint attaches with that file as its
``config.json`` and gives the logits TransformerLens 3.9 computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuitfade import compat
from circuitfade.io import CheckpointError, load_tensors, save_tensors
from circuitfade.store import attach
from circuitfade.compat import TL39_ONLY_DEFAULTS

pytestmark = pytest.mark.tl4
torch.set_num_threads(1)

DATA = Path(__file__).with_name("data")


def plant(folder: Path, config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    sd = load_tensors(DATA / "ht39_ln_mlp.safetensors")
    tokens, logits = sd.pop("_tokens"), sd.pop("_logits")
    folder.mkdir()
    save_tensors(folder / "step_100.safetensors", sd)
    (folder / "config.json").write_text(json.dumps(config))
    return tokens, logits


def test_a_saved_tl39_config_attaches_and_gives_the_tl39_logits(tmp_path):
    config = json.loads((DATA / "ht39_config.json").read_text())
    assert len(config) == 87 and set(TL39_ONLY_DEFAULTS) <= set(config) and config["dtype"] == "torch.float32"
    tokens, logits = plant(tmp_path / "c", config)
    series = attach(tmp_path / "c")
    assert series.steps == [100]
    with torch.no_grad():
        torch.testing.assert_close(series[100](tokens), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not compat.is_tl4(), reason="TransformerLens 3.9 has these fields")
def test_a_tl39_only_field_away_from_its_default_is_refused_on_4x(tmp_path):
    config = json.loads((DATA / "ht39_config.json").read_text())
    config["yarn_factor"] = 4.0
    plant(tmp_path / "c", config)
    with pytest.raises(CheckpointError, match=r"config\.json: yarn_factor=4\.0 \(3\.9 default 1\.0\).*TransformerBridgeConfig"):
        attach(tmp_path / "c")


def test_the_translation_is_compats_and_attach_uses_it(tmp_path):
    """``compat.config_from_dict`` is the one translation of a saved config to the installed line
    (``circuitfade.store.TL39_ONLY_DEFAULTS`` is compat's table); its refusals name the source."""
    import circuitfade.store as store

    assert store.TL39_ONLY_DEFAULTS is compat.TL39_ONLY_DEFAULTS
    config = json.loads((DATA / "ht39_config.json").read_text())
    cfg = compat.config_from_dict(config, "saved")
    assert compat.is_config(cfg) and cfg.dtype == torch.float32 and (cfg.n_layers, cfg.d_model) == (
        config["n_layers"], config["d_model"])
    with pytest.raises(CheckpointError, match=r"^saved: missing field\(s\) \['d_model'\]"):
        compat.config_from_dict({k: v for k, v in config.items() if k != "d_model"}, "saved")
    with pytest.raises(CheckpointError, match=r"^saved: field 'n_ctx' must be an integer, got '8'"):
        compat.config_from_dict({**config, "n_ctx": "8"}, "saved")
    with pytest.raises(CheckpointError, match=r"^saved: unknown \w+Config fields \['bogus'\]"):
        compat.config_from_dict({**config, "bogus": 1}, "saved")
    with pytest.raises(CheckpointError, match=r"^saved: field 'dtype': unknown torch dtype 'float31'"):
        compat.config_from_dict({**config, "dtype": "float31"}, "saved")
