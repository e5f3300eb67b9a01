"""Optimizer-step helpers shared by the trainer and the step benchmark."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

__all__ = ["OptimizerCalls", "clip_grad_norm"]


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)``, bit for bit, without its
    per-call grouping of tensors by device and dtype (~5% of a small model's step on one CPU
    thread). ``params``: a list fixed for the run. Returns the total gradient norm before
    clipping. Mixed devices or dtypes go to torch's own function."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    first = grads[0]
    if any(g.device != first.device or g.dtype != first.dtype for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class OptimizerCalls:
    """``optimizer.zero_grad(set_to_none=True)`` and ``optimizer.step()`` of the training loop, bit
    for bit, without torch's per-call overhead where it can be skipped.

    For the trainer's optimizer (:func:`~circuitfade.train.state.make_optimizer`: torch's AdamW
    with ``fused=True``, one parameter group, float32 parameters on the CPU) :meth:`step` calls the
    kernel ``AdamW.step`` calls (``torch._fused_adamw_``, after adding 1 to each step count) with the
    same arguments; ``AdamW.step`` itself also groups the tensors per device and dtype and enters
    profiler ranges each time, about 0.25 ms of a 10 ms step on one CPU thread. :meth:`zero_grad`
    sets the gradients of ``params`` (the optimizer's parameters) to ``None`` without torch's
    profiler range (about 0.13 ms). A step torch's own code must take (a parameter without optimizer
    state yet, which ``AdamW.step`` creates; a tensor learning rate or betas; step hooks; a gradient
    scaler's ``grad_scale``; sparse gradients) and any other optimizer go to the optimizer's own
    methods. The parameter group's
    settings are read at every step (a branch or a callback may change them).
    """

    def __init__(self, optimizer: Any, params: list[torch.Tensor]) -> None:
        self.optimizer, self.params = optimizer, params
        self.direct_steps = 0  # steps that called the kernel directly (tests read it)
        self._direct = (type(optimizer) is torch.optim.AdamW and hasattr(torch, "_fused_adamw_")
                        and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params))

    def zero_grad(self) -> None:
        """Every gradient of ``params`` set to ``None`` (``optimizer.zero_grad(set_to_none=True)``)."""
        if not self._direct:
            self.optimizer.zero_grad(set_to_none=True)
            return
        for p in self.params:
            p.grad = None

    def _kernel_args(self) -> tuple | None:
        """The parameter group and the kernel's tensor lists, or ``None`` where torch's own ``step`` must run."""
        opt = self.optimizer
        if not self._direct or len(opt.param_groups) != 1 or _step_hooks(opt) \
                or getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
            return None
        g = opt.param_groups[0]
        if (not g.get("fused") or not g.get("decoupled_weight_decay") or g.get("amsgrad") or g.get("maximize")
                or g.get("capturable") or g.get("differentiable") or isinstance(g["lr"], torch.Tensor)
                or any(isinstance(b, torch.Tensor) for b in g["betas"])):
            return None
        ps = [p for p in self.params if p.grad is not None]
        states = [opt.state.get(p) for p in ps]
        if not ps or not all(states) or any(p.grad.is_sparse for p in ps):
            return None
        return g, ps, [p.grad for p in ps], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], \
            [s["step"] for s in states]

    @torch.no_grad()
    def step(self) -> None:
        """``optimizer.step()``."""
        args = self._kernel_args()
        if args is None:
            self.optimizer.step()
            return
        g, ps, grads, exp_avgs, exp_avg_sqs, steps = args
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(ps, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=g["lr"],
                            beta1=g["betas"][0], beta2=g["betas"][1], weight_decay=g["weight_decay"], eps=g["eps"],
                            maximize=False, grad_scale=None, found_inf=None)
        self.direct_steps += 1


def _step_hooks(opt: torch.optim.Optimizer) -> bool:
    """Whether a step hook may be registered for ``opt`` (its own or every optimizer's); ``True`` where
    this torch keeps them elsewhere than where this reads them."""
    where = [getattr(opt, "_optimizer_step_pre_hooks", None), getattr(opt, "_optimizer_step_post_hooks", None),
             getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
             getattr(torch_optimizer, "_global_optimizer_post_hooks", None)]
    return any(hooks is None or len(hooks) > 0 for hooks in where)
