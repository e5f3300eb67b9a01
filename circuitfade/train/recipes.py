"""Ready-made training recipes: the local developing series.

:func:`build_local_series` trains a 2-layer language model (MLPs, BOS token, learned
absolute positional embeddings, no attention priors, no LayerNorm: see :data:`LOCAL_MODEL`)
on the ``repeats`` corpus (:mod:`circuitfade.tasks.repeats`: random text with a repeated
span, bigram copies and a skip-bigram rule), checkpointed at log-spaced steps:
previous-token heads form first, then induction heads on top of them. It is the series
``circuitfade local-series`` trains and ``circuitfade screen`` screens, with no download.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from circuitfade.train.config import RunConfig, TrainConfig
from circuitfade.train.loop import train

__all__ = ["LOCAL_STEPS", "LOCAL_MODEL", "LOCAL_TASK", "log_checkpoints", "local_run_config", "build_local_series"]

LOCAL_STEPS = 3000
"""Training steps of the full local series (about a minute on one CPU core)."""

LOCAL_MODEL = {
    "n_layers": 2,
    "n_heads": 4,
    "d_model": 64,
    "d_head": 16,
    "d_mlp": 256,
    "attn_only": False,
    "positional_embedding_type": "standard",
    "normalization_type": None,
    "priors": [],
}
"""The local model: a plain 2-layer transformer with MLPs, learned absolute positional
embeddings, no attention priors and no LayerNorm (``d_vocab`` and ``n_ctx`` come from
the task: 64 ordinary tokens + BOS, context 32).

No LayerNorm, because with pre-LN this small model (and the same model with rotary
embeddings, or with 2 or 1 heads per layer) consistently learned a *shifted*
induction circuit instead: its layer-1 heads attend to the position one *after* the
induction target and read the answer from a layer-0 previous-token head's output
there, so the screen's induction score (attention from ``t`` to ``t - L + 1``) does not
count them. Without LayerNorm the raw token embeddings keep their weight in the
residual stream and the classic circuit (a layer-0 previous-token head, a layer-1
head attending to ``t - L + 1``) forms."""

LOCAL_TASK = {"name": "repeats", "d_vocab": 64, "seq_len": 32, "min_span": 2, "max_span": 15, "skip_p": 0.5,
              "copy_p": 0.3, "score": "all"}
"""The local corpus (see :class:`~circuitfade.tasks.repeats.Repeats`): one repeated span
of 2-15 tokens, bigram copies (``copy_p``), a skip-bigram rule (``skip_p``) that
rewards previous-token heads; next-token loss at every position."""


def log_checkpoints(steps: int, n: int = 12, first: int = 10) -> tuple[int, ...]:
    """About ``n`` checkpoint steps log-spaced from ``first`` to ``steps`` (0 is added by the trainer).

    ``round(geomspace(first, steps, n))``, deduplicated and sorted.
    """
    if steps < 1 or n < 2 or first < 1:
        raise ValueError(f"need steps >= 1, n >= 2, first >= 1; got steps={steps}, n={n}, first={first}")
    first = min(first, steps)
    return tuple(sorted({int(round(x)) for x in np.geomspace(first, steps, n)}))


def local_run_config(steps: int = LOCAL_STEPS, *, seed: int = 0, n_checkpoints: int = 12) -> RunConfig:
    """The :class:`~circuitfade.train.config.RunConfig` of the local developing series.

    AdamW, lr 3e-3, batch 32, no gates (path ``"unforced"`` with no priors), eval on
    256 sequences every ``max(10, steps // 20)`` steps, checkpoints at step 0 and at
    :func:`log_checkpoints` ``(steps, n_checkpoints)``.
    """
    train_cfg = TrainConfig(
        steps=steps, batch_size=32, lr=3e-3, eval_every=max(10, steps // 20), eval_size=256,
        checkpoint_every=steps, extra_checkpoints=log_checkpoints(steps, n_checkpoints),
        eval_conditions=("normal",),
    )
    return RunConfig(path="unforced", task=dict(LOCAL_TASK), model=dict(LOCAL_MODEL), train=train_cfg, seed=seed)


def build_local_series(out: str | Path, *, steps: int = LOCAL_STEPS, seed: int = 0, n_checkpoints: int = 12,
                       progress: bool = False) -> Path:
    """Train the local developing series into the run directory ``out`` and return it.

    See :func:`local_run_config`. A finished run in ``out`` is reused (the trainer
    resumes an interrupted one). Set ``torch.set_num_threads(1)`` first for the
    timings quoted in :data:`LOCAL_STEPS`.
    """
    out = Path(out)
    train(local_run_config(steps, seed=seed, n_checkpoints=n_checkpoints), out, progress=progress)
    return out
