"""Writes ht39_config.json: what a TransformerLens 3.9 user saves beside their checkpoints,
``json.dump(cfg.to_dict(), f, default=str)``, for the model of ht39_ln_mlp.safetensors
(make_ht39_fixture.py), for tests/tl4/test_tl39_config.py.

Run with TransformerLens 3.9 (the default environment): ``python tests/tl4/data/make_ht39_config.py``.
"""

import json
from pathlib import Path

from make_ht39_fixture import CFG
from transformer_lens import HookedTransformerConfig

if __name__ == "__main__":
    cfg = HookedTransformerConfig(**CFG)
    out = Path(__file__).with_name("ht39_config.json")
    out.write_text(json.dumps(cfg.to_dict(), default=str, indent=1, sort_keys=True) + "\n")
    print(out, len(cfg.to_dict()), "fields")
