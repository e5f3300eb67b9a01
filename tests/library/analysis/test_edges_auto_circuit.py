"""Agreement of circuitfade's EAP edge scores with auto-circuit's edge attribution (an optional peer).

:mod:`circuitfade.analysis.peers` runs auto-circuit (the Makefile's default environment installs it)
and says where the two differ by design. The tests skip on TransformerLens 4.x, where auto-circuit
cannot run, and wherever it is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.edges import counterfactual_batch, edge_scores
from circuitfade.analysis.peers import auto_circuit_eap, auto_circuit_unavailable
from circuitfade.tasks import Batch, eval_set

TOL = 1e-5
"""Largest absolute difference allowed between the two scores of one edge (float32 models;
the same tolerance as the agreement with TransformerLens's own attribution patching)."""


REASON = auto_circuit_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _last_position_batch(n: int, pos: int, vocab: int, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, pos), generator=gen)
    targets = torch.full_like(tokens, -100)
    targets[:, -1] = torch.randint(0, vocab, (n,), generator=gen)
    return Batch.from_answers(tokens, [[pos - 1]] * n, targets=targets)


def test_eap_equals_auto_circuit_on_a_plain_model():
    """Every edge of a plain two-layer model with LayerNorm and MLPs (46 edges): the same edge
    set, the same scores and sign, for both of auto-circuit's implementations."""
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_head=16, n_ctx=8, d_vocab=10, d_mlp=64, act_fn="gelu",
               normalization_type="LN", seed=3)
    clean = _last_position_batch(16, 8, 10, seed=0)
    corrupted = counterfactual_batch(clean)
    model = compat.plain_model(cfg)
    model.eval()
    ours = edge_scores(model, clean, corrupted, method="eap", resamples=20).set_index("edge")["value"]
    for syed in (False, True):
        ref = auto_circuit_eap(compat.plain_model(cfg), clean, corrupted, syed=syed)
        assert set(ref) == set(ours.index) and len(ref) == 46
        theirs = np.array([ref[e] for e in ours.index])
        assert np.abs(ours.to_numpy() - theirs).max() < TOL, np.abs(ours.to_numpy() - theirs).max()
        assert np.abs(theirs).max() > 0.1


@pytest.mark.parametrize("step, gates", [(3600, None), (600, "zero")])
def test_eap_equals_auto_circuit_on_the_shipped_fade_series(step, gates):
    """The default soft-prior model (fade series; step 3600 has every gate at 0, step 600 is
    analysed under gates="zero"): auto-circuit on its plain backbone scores the 81 residual
    edges as circuitfade does; the 8 content-prior edges are circuitfade's alone and carry
    nothing at gate 0."""
    from circuitfade.store.examples import example_series

    series = example_series("fade600to0")
    model = series[step]
    clean = eval_set(series.task, n=32)
    corrupted = counterfactual_batch(clean)
    ours = edge_scores(model, clean, corrupted, method="eap", gates=gates, resamples=20)
    ref = auto_circuit_eap(model.to_plain_model(), clean, corrupted)
    extra = ours[~ours["edge"].isin(list(ref))]
    assert set(ref) <= set(ours["edge"]) and len(ref) == 81
    assert set(extra["kind"]) == {"prior"} and len(extra) == 8
    assert (extra["value"] == 0).all()
    shared = ours[ours["edge"].isin(list(ref))]
    diff = np.abs(shared["value"].to_numpy() - np.array([ref[e] for e in shared["edge"]]))
    assert diff.max() < TOL, diff.max()
    assert shared["value"].abs().max() > 0.5
