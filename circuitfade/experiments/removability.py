"""The removability map: where does the training path decide whether a circuit can
be removed?

A grid of cells (model size x task difficulty x budget). In each cell the same
runs: ``forced_zero`` (the baseline: no prior ever), ``fade600->0`` (the prior
helps, then is annealed away) and ``unforced`` (the prior is learned and kept).
The quantity of interest is the zero-gate accuracy margin
``fade600->0 - forced_zero`` with its interval over seeds.

Run configs are the same objects :mod:`circuitfade.experiments.paper` builds, so a
map run shared with ``circuitfade reproduce`` (e.g. the large model's default
cell) is trained once.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuitfade.train.loop import RunConfig, TrainConfig

MODELS = {  # label -> RunConfig.model overrides (4 heads throughout)
    "L2 d64": {},
    "L2 d128": {"d_model": 128, "d_head": 32},
    "L4 d64": {"n_layers": 4},
    "L4 d128": {"n_layers": 4, "d_model": 128, "d_head": 32, "n_heads": 4},
}
TASKS = {  # label -> RunConfig.task
    "recall (default)": {"name": "assoc"},
    "recall (shared vocab)": {"name": "assoc", "shared_vocab": True},
}
BASELINE, FADE, UNFORCED = "forced_zero", "fade600->0", "unforced"
PATHS = (BASELINE, FADE, UNFORCED)
# rough single-core minutes per 3,600-step run on the project's CI-class machine
COST_MIN = {"L2 d64": 1.5, "L2 d128": 2.5, "L4 d64": 3.0, "L4 d128": 8.0}


@dataclass(frozen=True)
class Cell:
    model: str
    task: str
    steps: int = 3600

    def config(self, path: str, seed: int) -> RunConfig:
        train = TrainConfig() if self.steps == 3600 else TrainConfig(steps=self.steps)
        return RunConfig(path=path, task=dict(TASKS[self.task]), model=dict(MODELS[self.model]), train=train, seed=seed)


def grid(models=None, tasks=None, steps=(3600,)) -> list[Cell]:
    models = list(MODELS) if models is None else list(models)
    tasks = list(TASKS) if tasks is None else list(tasks)
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown map model {name!r}; expected one of {list(MODELS)}")
    for name in tasks:
        if name not in TASKS:
            raise ValueError(f"unknown map task {name!r}; expected one of {list(TASKS)}")
    return [Cell(m, t, s) for s in steps for m in models for t in tasks]


def configs(cells, seeds=(0, 1, 2), paths=PATHS, unforced_seeds=(0,)) -> list[RunConfig]:
    """Run configs of ``cells``, cheapest cells first (a sweep cut short keeps whole cells)."""
    out = []
    for cell in sorted(cells, key=lambda c: (COST_MIN.get(c.model, 10) * c.steps, list(TASKS).index(c.task))):
        for seed in seeds:
            for p in paths:
                if p == UNFORCED and seed not in unforced_seeds:
                    continue
                out.append(cell.config(p, seed))
    return out
