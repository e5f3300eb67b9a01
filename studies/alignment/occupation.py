"""``python -m studies.alignment occupation``: a controlled gated-attention model of occupation.

The study proves, in a controlled gated-attention model, that heads *occupied* by the base task impose a
deadline on a new capability. This module is our controlled version, small enough to state exactly and
cheap enough to scan (seconds).

**The model.** ``K`` part heads attend over ``N`` key positions. Head ``k``'s attention logits on a sequence
of type ``t`` (``b``: base, ``c``: capability) are ``theta_k + phi_k^t + g * prior_k``: ``theta_k`` is the
*key side*, shared by both query types (what a QK circuit's keys carry whatever the query), ``phi_k^t`` the
query side of type ``t``, and ``g * prior_k`` a gated soft prior (``prior_k = beta * e_{c_k}``: the package's
position prior in miniature, pointing the part at its capability source; ``g = 0`` unless said). Base
sequences reward each part separately for attending its base source ``b_k = k`` (``L_b = -mean_k log
p^b_k[b_k]``: partial credit is fine there). Capability sequences need *all* parts on their sources
``c_k = K + k`` at once (no partial credit): the answer is right with probability ``a = prod_k p^c_k[c_k]``
and at chance ``1/V`` otherwise, ``L_c = -log(1/V + (1 - 1/V) a)``. Training: plain SGD (``lr``, weight
decay ``wd`` as L2) wrapped in :class:`~circuitfade.train.LangevinNoise` at temperature ``T``; base data only
for ``W`` steps, then the mix ``(1 - share) L_b + share L_c``; *ignition* = the first step at which
``a >= 0.5``; the *delay* is ignition step - ``W``, censored at ``budget``.

**Occupation.** Base training raises ``theta_k[b_k]`` (the base gradient on ``theta`` equals the one on
``phi^b``), so on *capability* sequences the occupied key side draws the part to ``b_k`` too:
``p^c_k[c_k]`` falls like ``exp(-m)`` in the key-side margin ``m = theta_k[b_k] - theta_k[c_k]``, and the
capability's gradient on any one part carries the product of the others (``prod_{j != k} p^c_j``), so the
drive falls like ``exp(-K m)``. Without weight decay ``m`` grows without bound (about ``log W``), so for any
budget there is a deadline ``W*``: a capability added later cannot ignite within the budget. Because GD from
a symmetric start keeps every non-source entry of ``theta_k`` equal, the state at the switch is (up to the
tiny initial noise) a function of ``m`` alone, so the delay is a function ``D(m)`` of the occupation margin,
whatever history produced it: **no mixing assumption** enters. The prediction for the critical ``W`` is
then ``W* = m^{-1}(D^{-1}(budget))``: read ``m(W)`` off one base-only trajectory, measure ``D`` on states
*planted* at given margins (no base training), and invert. :func:`run` makes that prediction first and then
measures ``W*`` by training base-then-capability at every ``W`` of the grid: the verdict compares the two.
Two cures follow from the model and are run at ``W`` past the deadline: re-initialising the key side
``theta`` (the toy's QK slice) restores ignition; re-initialising the capability query side ``phi^c``
does nothing (it was never the obstacle).

**The prediction it makes for item 3** (withheld capability on the K-part apparatus,
:mod:`studies.alignment.cure`): a deadline from occupation needs the *parts'* key-side attention to
commit to base sources. On our apparatus the parts' query-row attention is pinned by a fixed prior and their
other rows stay uniform (cure.md: mean-ablating the parts leaves the base loss unchanged), so this model
predicts **no occupation deadline there**: the critical W = 30000 we measured must come from elsewhere (the
spare head's commitment or weight decay shrinking unused weights), and the QK cure has nothing to undo,
which is what the 0/6 QK-cure count shows.

Parameters are fixed here before any scan (``CONFIG``); the figure and table are in ``OUT/occupation.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from circuitfade.claims import Outcome
from circuitfade.io import write_json
from circuitfade.stats import binomial_exact_interval
from circuitfade.train.langevin import LangevinNoise
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment.protocol import OCCUPATION_V1, stamp, stamped

__all__ = ["OccupationConfig", "CONFIG", "WS", "simulate", "base_margins", "planted_delays", "predict_critical_w",
           "critical_w", "occupation_verdicts", "run"]


@dataclass(frozen=True)
class OccupationConfig:
    K: int = 3          # parts
    N: int = 8          # key positions (b_k = k, c_k = K + k)
    V: int = 8          # answer vocabulary: chance = 1/V
    lr: float = 0.5
    wd: float = 0.0     # L2 weight decay (SGD's); 0: the margin grows without bound
    T: float = 1e-5     # Langevin temperature (makes the seeds differ; per-step noise sd 0.003 per logit)
    share: float = 0.5  # capability share of the mix after the switch
    budget: int = 3000  # steps after the switch within which the capability must ignite (see below)
    init_sd: float = 0.01
    gate: float = 0.0   # the gated prior's g (prior = beta * e_c)
    beta: float = 4.0
    seeds: int = 5


CONFIG = OccupationConfig(**OCCUPATION_V1.data["config"])
"""The configuration every reported number uses. Fixed from two checks of the *from-scratch* case only
(planted margin 0, 10 seeds, budget 6000): at ``T = 1e-4`` the noise alone kept 1 of 10 from-scratch seeds
from igniting, so the temperature was lowered to ``1e-5``, where every from-scratch seed ignited (median
~600 steps); the budget is 5x that. Nothing was set from the withholding scan or the prediction."""
WS = tuple(OCCUPATION_V1.data["ws"])
"""Withholding lengths scanned (base-only steps before the capability is added): fine where the base
task is being learned (the margin moves by ~0.1 per step there), coarse after."""
MARGINS = tuple(float(x) for x in np.round(np.arange(0.0, 8.01, 0.25), 2))
"""Key-side margins at which states are planted to measure ``D(m)``."""


def _index(cfg: OccupationConfig):
    k = torch.arange(cfg.K)
    return k, k, cfg.K + k  # part index, base sources, capability sources


def _init(cfg: OccupationConfig, batch: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [cfg.init_sd * torch.randn(batch, cfg.K, cfg.N, generator=g, dtype=torch.float64) for _ in range(3)]


def _accuracy(cfg: OccupationConfig, theta, phi_c) -> torch.Tensor:
    k, _, c = _index(cfg)
    prior = torch.zeros(cfg.K, cfg.N, dtype=theta.dtype)
    prior[k, c] = cfg.beta
    lp = torch.log_softmax(theta + phi_c + cfg.gate * prior, -1)[:, k, c]
    return lp.sum(-1).exp()


def simulate(cfg: OccupationConfig, state: Sequence[torch.Tensor], *, steps: int, share_from: int,
             seed: int, record: Sequence[int] = ()) -> dict:
    """Train the batch of models in ``state`` (``theta, phi_b, phi_c``, each ``[batch, K, N]``) for
    ``steps`` steps; the capability joins the mix at step ``share_from`` (``>= steps``: never).
    Returns the first step with capability accuracy >= 0.5 per model (-1: none), the final state, the
    key-side margin per model at the steps in ``record``, and the final capability accuracy."""
    theta, phi_b, phi_c = (t.clone().requires_grad_() for t in state)
    opt = LangevinNoise(torch.optim.SGD([theta, phi_b, phi_c], lr=cfg.lr, weight_decay=cfg.wd),
                        temperature=cfg.T, seed=seed)
    k, b, c = _index(cfg)
    ignited = torch.full((theta.shape[0],), -1, dtype=torch.long)
    margins, want = {}, set(record)
    for t in range(steps):
        if t in want:
            margins[t] = (theta.detach()[:, k, b] - theta.detach()[:, k, c]).mean(-1).numpy().copy()
        s = cfg.share if t >= share_from else 0.0
        lb = -torch.log_softmax(theta + phi_b, -1)[:, k, b].mean(-1)
        loss = lb
        if s > 0:
            acc = _accuracy(cfg, theta, phi_c)
            lc = -torch.log(1.0 / cfg.V + (1.0 - 1.0 / cfg.V) * acc)
            loss = (1 - s) * lb + s * lc
            new = (acc.detach() >= 0.5) & (ignited < 0)
            ignited[new] = t
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
        if not all(bool(torch.isfinite(p).all()) for p in (theta, phi_b, phi_c)):
            raise FloatingPointError(f"occupation model diverged at step {t} (lr {cfg.lr})")
    if steps in want:
        margins[steps] = (theta.detach()[:, k, b] - theta.detach()[:, k, c]).mean(-1).numpy().copy()
    final = [theta.detach(), phi_b.detach(), phi_c.detach()]
    return {"ignited": ignited.numpy(), "state": final, "margins": margins,
            "acc": _accuracy(cfg, final[0], final[2]).numpy()}


def base_margins(cfg: OccupationConfig, ws: Sequence[int] = WS) -> tuple[pd.DataFrame, dict]:
    """One base-only trajectory per seed to ``max(ws)``: the key-side margin ``m(W)`` per seed, and the
    states at each ``W`` (for the withholding runs)."""
    ws = sorted(set(int(w) for w in ws))
    states: dict[int, list[torch.Tensor]] = {}
    state = _init(cfg, cfg.seeds, seed=0)
    rows, done = [], 0
    for w in ws:  # advance the same trajectory from one W to the next
        if w > done:
            res = simulate(cfg, state, steps=w - done, share_from=10**12, seed=1 + done, record=[w - done])
            state, margin = res["state"], res["margins"][w - done]
            done = w
        else:
            k, b, c = _index(cfg)
            margin = (state[0][:, k, b] - state[0][:, k, c]).mean(-1).numpy()
        states[w] = [t.clone() for t in state]
        rows += [{"w": w, "seed": s, "margin": float(margin[s])} for s in range(cfg.seeds)]
    return pd.DataFrame(rows), states


def _planted_state(cfg: OccupationConfig, m: float, batch: int, seed: int) -> list[torch.Tensor]:
    """The state GD from a symmetric start reaches on base data, at key-side margin ``m``: on each part
    ``theta = phi^b = a (e_b - 1/(N-1) (1 - e_b))`` with ``a (1 + 1/(N-1)) = m`` (sum zero), plus the
    initial noise; ``phi^c`` untouched."""
    theta, phi_b, phi_c = _init(cfg, batch, seed)
    k, b, _ = _index(cfg)
    a = m / (1.0 + 1.0 / (cfg.N - 1))
    shape = torch.full((cfg.K, cfg.N), -a / (cfg.N - 1), dtype=torch.float64)
    shape[k, b] = a
    return [theta + shape, phi_b + shape, phi_c]


def planted_delays(cfg: OccupationConfig, margins: Sequence[float] = MARGINS) -> pd.DataFrame:
    """``D(m)``: the delay to ignition from states planted at key-side margin ``m`` (no base training),
    per seed; ``delay`` NaN where it did not ignite within the budget."""
    ms = list(margins)
    state = [torch.cat([t for t in parts]) for parts in zip(*[_planted_state(cfg, m, cfg.seeds, seed=100 + i)
                                                              for i, m in enumerate(ms)])]
    res = simulate(cfg, state, steps=cfg.budget, share_from=0, seed=7)
    rows = []
    for i, m in enumerate(ms):
        for s in range(cfg.seeds):
            ig = int(res["ignited"][i * cfg.seeds + s])
            rows.append({"margin": m, "seed": s, "delay": float(ig) if ig >= 0 else math.nan})
    return pd.DataFrame(rows)


def _median_or_inf(x) -> float:
    x = np.asarray(x, dtype=float)
    x = np.where(np.isnan(x), np.inf, x)
    return float(np.median(x))


def predict_critical_w(margin_w: pd.DataFrame, delays_m: pd.DataFrame) -> dict:
    """``W* = m^{-1}(D^{-1}(budget))``: ``m_crit`` = the smallest planted margin from which on no planted
    seed ignites within the budget (``None`` if every margin has one), then the first scanned ``W`` whose
    median base-only margin reaches it (``None``: not on the grid), and the predicted median delay at every
    ``W`` (``D``'s median over seeds, censored runs counted as infinite, interpolated linearly in ``m``
    at the median margin). The same "no seed ignites" definition as :func:`critical_w` on the scan."""
    ign = delays_m.assign(ok=delays_m.delay.notna()).groupby("margin").ok.sum().sort_index()
    crit = None
    for m in ign.index[::-1]:  # walk down from the largest margin while no seed ignites
        if ign[m] > 0:
            break
        crit = float(m)
    d = delays_m.groupby("margin").delay.apply(_median_or_inf).sort_index()
    mw = margin_w.groupby("w").margin.median().sort_index()
    w_star = next((int(w) for w, m in mw.items() if crit is not None and m >= crit), None)
    finite = d[np.isfinite(d.to_numpy())]
    pred = {}
    for w, m in mw.items():
        if len(finite) and m <= finite.index.max():
            pred[int(w)] = float(np.interp(m, finite.index.to_numpy(float), finite.to_numpy(float)))
        else:
            pred[int(w)] = math.inf
    return {"m_crit": crit, "w_star": w_star, "predicted_delay": pred}


def critical_w(scan: pd.DataFrame) -> int | None:
    """Smallest scanned ``W`` at which no seed ignites within the budget (``None``: every ``W`` has one)."""
    by = scan.groupby("w").ignited.sum().sort_index()
    return next((int(w) for w, n in by.items() if n == 0), None)


def occupation_verdicts(pred: dict, measured: int | None, cures: dict, ws: Sequence[int]) -> pd.DataFrame:
    """Rules: the deadline claim holds if some scanned ``W`` has no seed igniting; the prediction holds if
    the predicted and measured ``W*`` are the same grid point or adjacent ones (the first version of this
    module compared a median-based ``m_crit`` with the no-seed ``W*``: two definitions; both now use
    "no seed ignites", and the README reports the first result too);
    the key-side cure restores ignition if >= n-1 of n seeds ignite, the query-side one does nothing if
    <= 1 does."""
    ws = sorted(ws)
    rows = [{"claim": "occupation imposes a deadline (some W never ignites within the budget)",
             "ours": f"critical W = {measured}" if measured is not None else "none on the grid",
             "study": "a deadline exists", "rule": "reproduced if some scanned W has 0 seeds igniting within the budget",
             "verdict": Outcome.REPRODUCED if measured is not None else Outcome.NOT_REPRODUCED}]
    p = pred["w_star"]
    if p is None or measured is None:
        ok = p is None and measured is None
    else:
        ok = abs(ws.index(p) - ws.index(measured)) <= 1
    rows.append({"claim": "the deadline is predicted from the occupation margin alone (W* = m^-1(D^-1(budget)))",
                 "ours": f"predicted W* = {p} (m_crit = {pred['m_crit']}), measured {measured}",
                 "study": "no mixing assumption needed",
                 "rule": "reproduced if predicted and measured W* are the same or adjacent grid points (or both absent)",
                 "verdict": Outcome.REPRODUCED if ok else Outcome.NOT_REPRODUCED})
    for arm, want_all, study in (("key side (QK) re-init", True, "6/6 (transformer)"),
                                 ("capability query side re-init", False, "0/6 (value side, transformer)")):
        if arm not in cures:
            continue
        k, n = cures[arm]
        lo, hi = binomial_exact_interval(k, n)
        good = (k >= n - 1) if want_all else (k <= 1)
        rows.append({"claim": f"past the deadline, {arm} {'restores ignition' if want_all else 'does nothing'}",
                     "ours": f"{k}/{n} [{lo:.2f}, {hi:.2f}]", "study": study,
                     "rule": f"reproduced if {'>= n-1' if want_all else '<= 1'} of n >= 5 seeds ignite",
                     "verdict": Outcome.REPRODUCED if good and n >= 5 else Outcome.NOT_REPRODUCED})
    return pd.DataFrame(rows)


def occupation_figure(margin_w: pd.DataFrame, delays_m: pd.DataFrame, scan: pd.DataFrame, pred: dict, budget: int):
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "delay to ignition vs the key-side margin at the switch", "delay vs withheld steps W"))
    dm = delays_m.copy()
    dm["shown"] = dm.delay.fillna(budget * 1.05)
    fig.add_scatter(x=dm.margin, y=dm.shown, mode="markers", name="planted margin (seeds)", row=1, col=1,
                    marker={"size": 6, "opacity": 0.6})
    sc = scan.merge(margin_w, on=["w", "seed"])
    sc["shown"] = sc.delay.fillna(budget * 1.05)
    fig.add_scatter(x=sc.margin, y=sc.shown, mode="markers", name="trained (base for W steps)", row=1, col=1,
                    marker={"symbol": "x", "size": 8})
    x = [w + 1 for w in sc.w]
    fig.add_scatter(x=x, y=sc.shown, mode="markers", name="measured (seeds)", row=1, col=2, marker={"size": 7})
    pw = sorted(pred["predicted_delay"].items())
    fig.add_scatter(x=[w + 1 for w, _ in pw], y=[min(v, budget * 1.05) for _, v in pw], mode="lines+markers",
                    name="predicted from D(m(W))", row=1, col=2, line={"dash": "dash"})
    for col in (1, 2):
        fig.add_hline(y=budget, line_dash="dot", row=1, col=col)
    fig.add_annotation(text="dotted: budget; points above it never ignited", xref="paper", yref="paper", x=0.5,
                       y=-0.22, showarrow=False)
    fig.update_xaxes(title_text="key-side margin m = theta[b] - theta[c]", row=1, col=1)
    fig.update_xaxes(title_text="W + 1 (W: base-only steps before the switch)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="steps from switch to ignition", row=1, col=1)
    fig.update_layout(title="Occupation model: the delay is a function of the occupied key side, and a deadline follows",
                      width=1200, height=480)
    return fig


def run(*, out: str | Path = "results/alignment", cfg: OccupationConfig = CONFIG, ws: Sequence[int] = WS,
        png: bool = True) -> dict:
    """Predict W* (base margins + planted delays), then measure it (withholding scan) and the two cures."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    margin_w, states = base_margins(cfg, ws)
    delays_m = planted_delays(cfg)
    pred = predict_critical_w(margin_w, delays_m)  # the prediction, before the scan below
    wl = sorted(states)
    batch = [torch.cat([states[w][i] for w in wl]) for i in range(3)]
    res = simulate(cfg, batch, steps=cfg.budget, share_from=0, seed=11)
    rows = []
    for j, w in enumerate(wl):
        for s in range(cfg.seeds):
            ig = int(res["ignited"][j * cfg.seeds + s])
            rows.append({"w": w, "seed": s, "ignited": ig >= 0, "delay": float(ig) if ig >= 0 else math.nan})
    scan = pd.DataFrame(rows)
    w_meas = critical_w(scan)
    cures = {}
    w_cure = w_meas if w_meas is not None else max(wl)
    fresh = _init(cfg, cfg.seeds, seed=999)
    for arm, idx in (("key side (QK) re-init", 0), ("capability query side re-init", 2)):
        st = [t.clone() for t in states[w_cure]]
        st[idx] = fresh[idx].clone()
        r = simulate(cfg, st, steps=cfg.budget, share_from=0, seed=13 + idx)
        cures[arm] = (int((r["ignited"] >= 0).sum()), cfg.seeds)
    verdicts = occupation_verdicts(pred, w_meas, cures, wl)
    table = (scan.groupby("w").agg(seeds=("seed", "size"), ignited=("ignited", "sum"),
                                   delay_median=("delay", "median")).reset_index()
             .merge(margin_w.groupby("w").margin.median().rename("margin_median").reset_index(), on="w"))
    table["predicted_delay"] = table.w.map(pred["predicted_delay"])
    both = table[np.isfinite(table.predicted_delay) & table.delay_median.notna() & (table.ignited * 2 > table.seeds)]
    rel = (both.predicted_delay - both.delay_median).abs() / both.delay_median
    rel_err, n_rel = (float(rel.median()) if len(rel) else math.nan), int(len(rel))
    # 12 significant digits: the last bits of a float sum differ between library builds
    scan.merge(margin_w, on=["w", "seed"]).to_csv(out / "occupation_scan.csv", index=False, float_format="%.12g")
    delays_m.to_csv(out / "occupation_planted.csv", index=False, float_format="%.12g")
    write_json(out / "occupation.json", {"config": asdict(cfg), "ws": list(wl), "prediction": {
        "m_crit": pred["m_crit"], "w_star": pred["w_star"]}, "measured_w_star": w_meas, "cure_w": w_cure,
        "delay_median_relative_error": rel_err, "delay_n_w": n_rel,
        "cures": {k: list(v) for k, v in cures.items()}})
    fig = occupation_figure(margin_w, delays_m, scan, pred, cfg.budget)
    save_figure(fig, out / "fig_occupation", png=png)  # HTML always; a failed PNG export is reported there
    c = cfg
    md = "\n".join([
        "## Occupation: a controlled gated-attention model of the deadline (version 1)", "",
        f"Protocol: {stamp('occupation', 1)}.",
        f"`python -m studies.alignment occupation` (`studies/alignment/occupation.py`; model and rules in its docstring). "
        f"K = {c.K} parts, N = {c.N} keys, V = {c.V}, SGD lr {c.lr}, weight decay {c.wd}, Langevin T = {c.T}, "
        f"capability share {c.share} after the switch, budget {c.budget} steps, gate g = {c.gate}, "
        f"{c.seeds} seeds; one thread.", "",
        f"Prediction (from the base-only margins and the planted states, before the scan): m_crit = "
        f"{pred['m_crit']} (from this planted key-side margin on, no seed ignites within the budget), "
        f"predicted W* = {pred['w_star']}. Measured critical W = {w_meas} (no seed ignites); cures at "
        f"W = {w_cure}. Predicted vs measured median delay where both ignite: median relative error "
        f"{rel_err:.2f} over {n_rel} W.", "",
        markdown_table(table), "", markdown_table(verdicts), ""])
    (out / "occupation.md").write_text(md)
    verdicts = stamped(verdicts, "occupation", 1, "toy model (no transformer)")
    verdicts.to_csv(out / "occupation_verdicts.csv", index=False)
    return {"scan": scan, "margins": margin_w, "planted": delays_m, "prediction": pred, "measured": w_meas,
            "cures": cures, "verdicts": verdicts, "markdown": md}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m studies.alignment.occupation")
    ap.add_argument("--out", default="results/alignment")
    ap.add_argument("--no-png", action="store_true")
    ns = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(run(out=ns.out, png=not ns.no_png)["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
