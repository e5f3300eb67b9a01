"""Writes ht39_ln_mlp.safetensors: a small HookedTransformer (LayerNorm, GELU MLPs) saved by
TransformerLens 3.9, with its logits on fixed tokens (tensor ``_logits``, ``_tokens``),
for tests/tl4/test_lines.py::test_a_tl3_state_dict_gives_the_same_logits_on_this_line.

Run with TransformerLens 3.9 (the default environment): ``python tests/tl4/data/make_ht39_fixture.py``.
"""

from pathlib import Path

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitfade.io import save_tensors

CFG = dict(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=4, d_vocab=12, d_mlp=32, act_fn="gelu",
           normalization_type="LN", positional_embedding_type="standard", seed=3)

if __name__ == "__main__":
    model = HookedTransformer(HookedTransformerConfig(**CFG)).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values (init leaves them at 1 and 0)
        g = torch.Generator().manual_seed(4)
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b")) or ".b_" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        tokens = torch.randint(0, CFG["d_vocab"], (3, CFG["n_ctx"]), generator=g)
        logits = model(tokens)
    sd = {**model.state_dict(), "_tokens": tokens, "_logits": logits}
    save_tensors(Path(__file__).with_name("ht39_ln_mlp.safetensors"), sd)
    print(sorted(model.state_dict()))
