"""Langevin noise on top of any torch optimizer, at a scheduled temperature.

:class:`LangevinNoise` wraps an optimizer; after the base ``step()`` at step count ``t`` it adds, to every
parameter the base step updated (``p.grad is not None``) in a param group with learning rate ``lr``::

    p <- p + sqrt(2 * lr * T(t) * s) * xi,     xi ~ N(0, I)  (drawn from the wrapper's own generator)

``T(t)``: the temperature schedule (a :class:`~circuitfade.gating.schedules.Schedule`, a spec string such as
``"linear1e-3->0@0:2000"``, or a number), ``s``: the group's ``"noise_scale"`` entry (default 1; 0 pins a
group: no noise on it). At ``T = 0`` nothing is drawn and the wrapper is the base optimizer bit for bit.

Stationary distribution: with plain SGD (no momentum) this is the Euler-Maruyama step of
``d theta = -grad L dt + sqrt(2 T) dW`` with time step ``lr``, whose stationary density is
``exp(-L / T)`` (``L`` includes SGD's weight decay as ``wd / 2 |theta|^2``). For a finite ``lr`` it is exact
only in the limit ``lr -> 0``: on ``L = k x^2 / 2`` the chain ``x' = (1 - lr k) x + sqrt(2 lr T) xi`` has
variance ``T / (k (1 - lr k / 2))``, not ``T / k`` (tested). Mini-batch gradient noise adds to ``T``. For
SGD with momentum, Adam or AdamW the stationary density is *not* ``exp(-L / T)``: the drift is
preconditioned (Adam) or has inertia (momentum) while the injected noise is isotropic.

Reproducible and checkpointable: :meth:`LangevinNoise.state_dict` holds the base optimizer's state, the
step count ``t`` and the generator state; :meth:`load_state_dict` restores all three.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from circuitfade.gating.schedules import DEFAULT_TOTAL_STEPS, Schedule, as_schedule

__all__ = ["LangevinNoise"]


class LangevinNoise:
    """``LangevinNoise(torch.optim.SGD(params, lr=0.1), temperature="linear1e-3->0", seed=0)``.

    Exposes ``param_groups``, ``state``, ``zero_grad``, ``step``, ``state_dict`` and ``load_state_dict``
    like an optimizer; ``temperature_now`` is ``T`` of the next step, ``steps`` the number taken so far.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, temperature: Schedule | str | float = 0.0,
                 seed: int = 0, total_steps: int = DEFAULT_TOTAL_STEPS):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"LangevinNoise wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.schedule = as_schedule(temperature, total_steps)
        lo, _ = self.schedule.value_range()
        if lo < 0:
            raise ValueError(f"temperature must be >= 0 at every step, schedule {self.schedule.spec} reaches {lo}")
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.steps = 0

    # -- the optimizer interface ---------------------------------------------------------
    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    temperature_now = property(lambda self: self.schedule(self.steps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None):
        """The base step, then the noise at ``T(steps)``; returns what the base step returned."""
        out = self.optimizer.step() if closure is None else self.optimizer.step(closure)
        T = self.schedule(self.steps)
        if T > 0:
            with torch.no_grad():
                for group in self.optimizer.param_groups:
                    var = 2.0 * float(group["lr"]) * T * float(group.get("noise_scale", 1.0))
                    if var < 0:
                        raise ValueError(f"noise variance 2 lr T s = {var} < 0 (negative lr or noise_scale?)")
                    if var == 0:
                        continue
                    sigma = math.sqrt(var)
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        xi = torch.randn(p.shape, generator=self.generator, dtype=p.dtype)
                        p.add_(xi.to(p.device), alpha=sigma)
        self.steps += 1
        return out

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"base": self.optimizer.state_dict(),
                "langevin": {"steps": self.steps, "seed": self.seed, "temperature": self.schedule.spec,
                             "generator": self.generator.get_state()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore the base optimizer, the step count and the generator (the temperature schedule is the
        wrapper's own: a differing saved spec raises ``ValueError`` rather than silently changing it)."""
        lv = state.get("langevin") if isinstance(state, dict) else None
        if not isinstance(lv, dict) or "base" not in state or not {"steps", "generator"} <= set(lv):
            raise ValueError("LangevinNoise.load_state_dict: not a LangevinNoise state (needs 'base', 'langevin')")
        if "temperature" in lv and lv["temperature"] != self.schedule.spec:
            raise ValueError(f"LangevinNoise.load_state_dict: saved temperature {lv['temperature']!r} differs "
                             f"from this wrapper's {self.schedule.spec!r}")
        self.optimizer.load_state_dict(state["base"])
        self.generator.set_state(lv["generator"])
        self.steps = int(lv["steps"])
        self.seed = int(lv.get("seed", self.seed))

    def __repr__(self) -> str:
        return f"LangevinNoise({type(self.optimizer).__name__}, temperature={self.schedule.spec!r}, steps={self.steps})"
