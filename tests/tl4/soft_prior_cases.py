"""The soft-prior model cases that the line-equivalence tests and their fixture share.

``tests/tl4/data/make_soft_prior_fixture.py`` runs :func:`outputs` on TransformerLens 3.9
(the ``HookedTransformer`` shell) and stores the results; ``test_soft_prior_lines.py``
runs it again on the installed line and compares. Every case is small (a few thousand
parameters) so the fixture stays small.
"""

from __future__ import annotations

import torch

SEED = 11
TINY = dict(n_layers=2, d_model=8, d_head=2, n_heads=4, n_ctx=8, d_vocab=10)
CASES = {
    "nope_pos_content": {},
    "priors_off": dict(priors=()),
    "standard_ln_gelu_mlp": dict(positional_embedding_type="standard", attn_only=False, act_fn="gelu", d_mlp=16),
    "rotary_alibi": dict(positional_embedding_type="rotary", priors=("pos", "alibi")),
    "shortformer_lnpre_relu": dict(positional_embedding_type="shortformer", normalization_type="LNPre",
                                   attn_only=False, act_fn="relu", d_mlp=16),
    "zoo_priors": dict(priors=("t5", "kerple_log", "fire", "cope", "dape", "gpsa")),
    "rms_seeded_gelu_new": dict(normalization_type="RMS", seed=7, attn_only=False, act_fn="gelu_new", d_mlp=16),
    "attn_result_no_norm": dict(use_attn_result=True, normalization_type=None, priors=("pos",)),
    "real_inputs": dict(input_mode="real", d_vocab=5, d_vocab_out=1),
    "scheduled_fixed_gates": dict(gate_modes={"pos": "scheduled", "content": "fixed"}, gate_init=0.3),
}
ROWS = (2, 7)  # answer positions for the positions= path

RUN_CONFIG = dict(  # a tiny training run (RunConfig keyword arguments)
    path="fade6+12->0",
    task={"name": "assoc", "n_pairs": 3, "n_keys": 4, "n_values": 4, "d_vocab": 8, "max_len": 8},
    model={"d_model": 16, "d_head": 4, "n_heads": 4, "n_ctx": 8, "d_vocab": 8},
    train={"steps": 24, "batch_size": 16, "eval_every": 6, "eval_size": 64, "checkpoint_every": 12},
    seed=3,
)
RUN200_CONFIG = dict(  # the 200-step run on the base model that the docs quote
    path="fade60+100->0", task={"name": "assoc"}, seed=0,
    train={"steps": 200, "eval_every": 20, "checkpoint_every": 100},
)


def config(name: str):
    from circuitfade.model import SoftPriorConfig

    return SoftPriorConfig(**{**TINY, **CASES[name]})


def build(name: str, cls=None, cfg=None):
    """The case's model, freshly initialised after ``torch.manual_seed(SEED)``."""
    if cls is None:
        from circuitfade.model import SoftPriorTransformer as cls
    cfg = config(name) if cfg is None else cfg
    torch.manual_seed(SEED)
    return cls(cfg)


def perturb(model) -> None:
    """Non-trivial position tables, biases and norm weights (initialisation leaves them 0 or 1)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pos_bias" in name or name.endswith((".b", ".w", "b_Q", "b_K", "b_V", "b_O", "b_U", "b_in", "b_out")):
                p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def inputs(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(6)
    cfg = model.cfg
    if cfg.input_mode == "real":
        return torch.randn(3, cfg.n_ctx, cfg.d_vocab, generator=g, dtype=torch.float64).float()
    return torch.randint(0, cfg.d_vocab, (3, cfg.n_ctx), generator=g)


def _loss(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().pow(2).mean()


def outputs(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Logits and gradients of ``mean(logits²)`` on the fused, hooked and answer-position
    paths, and the logits with every gate at zero, as ``{kind/name: tensor}``."""
    out: dict[str, torch.Tensor] = {}
    rows = torch.tensor(ROWS)
    before = model.use_fused
    try:
        for path in ("fused", "hooked", "rows"):
            model.use_fused = path != "hooked"
            model.zero_grad(set_to_none=True)
            if path == "rows":
                logits = model(x, positions=rows)
                _loss(logits[:, rows]).backward()
            else:
                logits = model(x)
                _loss(logits).backward()
            out[f"logits_{path}"] = logits.detach().clone()
            for n, p in model.named_parameters():
                if p.grad is not None:
                    out[f"grad_{path}/{n}"] = p.grad.detach().clone()
        model.zero_grad(set_to_none=True)
        model.use_fused = True
        with torch.no_grad(), model.gates(**{p: 0.0 for p in model.cfg.priors}):
            out["logits_zero_gates"] = model(x).clone()
    finally:
        model.use_fused = before
    return out


def hook_shapes(model, x: torch.Tensor) -> dict[str, list[int]]:
    """``{hook name: activation shape}`` of every hook that fires in ``run_with_cache``."""
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    return {k: list(v.shape) for k, v in cache.items()}
