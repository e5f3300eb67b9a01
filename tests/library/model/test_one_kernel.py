"""The soft-prior attention is written once: :mod:`circuitfade.model.fused` holds it
(``prior_attention``, ``fused_block``, ``fused_logits``, ``causal_mask``) and the stacked
model (:mod:`circuitfade.train.stacked`) calls those functions on its stacked weights. A
checker reads the stacked model's source and fails on attention arithmetic of its own
(softmax, query-key products, causal masks, score scaling); it is also run on planted code,
so a checker that sees nothing cannot pass by accident."""

from __future__ import annotations

import ast

import pytest
from repo_root import REPO

STACKED = REPO / "circuitfade" / "train" / "stacked.py"

# calls that only attention arithmetic needs (the stacked embedding's ``bmm`` is not one of them)
_CALLS = {"softmax", "log_softmax", "_softmax", "einsum", "matmul", "triu", "tril", "triu_indices", "tril_indices",
          "masked_fill", "masked_fill_", "scaled_dot_product_attention", "multi_head_attention_forward", "sqrt"}
_NAMES = {"attn_scale", "IGNORE"}  # the score divisor and TransformerLens's mask value
_CORE = ("prior_attention", "fused_block", "fused_logits", "causal_mask")


def _attention_arithmetic(source: str) -> list[str]:
    """``line: what`` for each piece of attention arithmetic in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.append(f"{line}: a matrix product with @")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
            found.append(f"{line}: a matrix product with @=")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in _CALLS:
                found.append(f"{line}: {name}(...)")
        elif isinstance(node, ast.Attribute) and node.attr in _NAMES:
            found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip().lstrip("+-") in (
                "inf", "infinity"):
            found.append(f"{line}: an infinite mask value {node.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value in (float("inf"),
                                                                                                   float("-inf")):
            found.append(f"{line}: an infinite mask value")
        elif isinstance(node, ast.Attribute) and node.attr in ("inf", "neg_inf") and isinstance(node.value, ast.Name):
            found.append(f"{line}: {node.value.id}.{node.attr}")
    return found


def _calls_core(source: str) -> set[str]:
    """The functions of ``_CORE`` that ``source`` imports from :mod:`circuitfade.model.fused`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "circuitfade.model.fused":
            names |= {a.name for a in node.names}
    return names & set(_CORE)


def test_the_stacked_model_has_no_attention_arithmetic_of_its_own():
    source = STACKED.read_text()
    found = _attention_arithmetic(source)
    assert not found, ("circuitfade/train/stacked.py computes attention itself (call the functions of "
                       "circuitfade.model.fused instead): " + "; ".join(found))
    assert _calls_core(source) == set(_CORE)  # and it runs the core functions instead


PLANTED = {
    "softmax": "pattern = torch.softmax(scores, dim=-1)\n",
    "softmax method": "pattern = scores.softmax(-1)\n",
    "functional softmax": "pattern = F.softmax(scores, -1)\n",
    "query-key product": "scores = q @ k.transpose(-1, -2)\n",
    "matmul": "scores = torch.matmul(q, k.mT)\n",
    "einsum": "scores = torch.einsum('ebhqd,ebhkd->ebhqk', q, k)\n",
    "causal mask triu": "mask = torch.full((n, n), -1e9).triu(1)\n",
    "causal mask tril": "keep = torch.ones(n, n).tril().bool()\n",
    "infinite mask": "mask = torch.full((n, n), float('-inf'))\n",
    "infinite mask constant": "mask = scores.new_full((n, n), -math.inf)\n",
    "masked fill": "scores = scores.masked_fill(~keep, -1e9)\n",
    "sdpa": "out = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n",
    "score scale": "q = q / attn.attn_scale\n",
    "sqrt scale": "q = q / math.sqrt(d_head)\n",
}


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_the_checker_sees_planted_attention_arithmetic(what):
    source = STACKED.read_text()
    planted = source + "\n\ndef _attention(q, k, v, scores, attn, n, d_head, keep):\n    " + PLANTED[what] + "    return 0\n"
    assert _attention_arithmetic(source) == []
    found = _attention_arithmetic(planted)
    assert found, f"the checker missed planted {what}: {PLANTED[what]!r}"
    assert all(int(f.split(":")[0]) > source.count("\n") for f in found)


def test_the_checker_sees_the_old_stacked_attention():
    """The stacked model's former copy of the attention (a softmax over q k^T plus a triu mask)."""
    old = (
        "def logits(self, x):\n"
        "    causal = torch.full((n, n), float('-inf'), device=x.device).triu(1)\n"
        "    scale = attn.attn_scale\n"
        "    pattern = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)\n"
        "    return pattern @ v\n"
    )
    kinds = {f.split(": ", 1)[1] for f in _attention_arithmetic(old)}
    assert kinds == {"a matrix product with @", "triu(...)", "softmax(...)", ".attn_scale",
                     "an infinite mask value '-inf'"}
