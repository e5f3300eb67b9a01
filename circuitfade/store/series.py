"""The series itself: :class:`Snapshot` and :class:`CheckpointSeries` (lazy loading,
sub-series, gate schedule)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from circuitfade.io import MAX_STEP, CheckpointError, check_finite
from circuitfade.gating.paths import GatePath
from circuitfade.tasks import Task


# --------------------------------------------------------------------------------------
# the series
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """One checkpoint of a series: its ``step``, a zero-argument ``load`` that builds the
    model, and ``source`` (a file, folder or description) named in error messages."""

    step: int
    load: Callable[[], nn.Module]
    source: str

    def __post_init__(self):
        if isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral):
            raise ValueError(f"Snapshot.step must be an integer, got {self.step!r} ({self.source})")
        if not -MAX_STEP - 1 <= self.step <= MAX_STEP:
            raise ValueError(f"Snapshot.step {self.step} is beyond int64 ({self.source})")
        object.__setattr__(self, "step", int(self.step))
        if not callable(self.load):
            raise ValueError(f"Snapshot.load must be a zero-argument callable, got {self.load!r}")


def _fmt_steps(steps: Sequence[int], limit: int = 8) -> str:
    if len(steps) <= limit:
        return "[" + ", ".join(map(str, steps)) + "]"
    head = ", ".join(map(str, steps[: limit - 2]))
    return f"[{head}, ..., {steps[-1]}]"


class CheckpointSeries:
    """A lazy, step-ordered sequence of ``(step, model)`` snapshots.

    * ``len(series)``, ``series.steps`` (sorted list of ints);
    * ``for step, model in series`` loads each model when reached (in eval mode),
      so only one is alive at a time unless the caller keeps references; every
      access loads afresh (no cache), so callers may modify what they get;
    * ``series[step]`` -> the model at ``step`` (``KeyError`` listing the available
      steps otherwise);
    * ``series.range(start, stop, every)`` and ``series.select(steps)`` -> sub-series
      sharing loaders, metadata, task and gate information;
    * ``series.metadata``: a dict of scalars describing the series (for circuitfade
      runs ``run``, ``run_dir``, ``path`` (the gate path), ``seed``, ``task``);
      :func:`trace` adds each key as a column;
    * ``series.task``: the run's :class:`~circuitfade.tasks.Task` (circuitfade runs) or ``None``;
    * ``series.gate_path``: the run's :class:`~circuitfade.gating.paths.GatePath` or ``None``,
      ``series.gate_value(step)`` its prescribed gate, ``series.gate_zero_step()``.

    ``gate_span = (first_step, last_step)`` is the training span of the run the gate
    path applies to (``(parent_step, train.steps)`` for a branch).
    """

    def __init__(
        self,
        snapshots: Iterable[Snapshot],
        metadata: Mapping[str, Any] | None = None,
        *,
        task: Task | None = None,
        gate_path: GatePath | None = None,
        gate_span: tuple[int, int] | None = None,
        source: str | None = None,
    ):
        snaps = list(snapshots)
        for s in snaps:
            if not isinstance(s, Snapshot):
                raise ValueError(f"CheckpointSeries expects Snapshot objects, got {type(s).__name__}")
        snaps.sort(key=lambda s: s.step)
        seen: dict[int, str] = {}
        for s in snaps:
            if s.step in seen:
                raise ValueError(f"duplicate step {s.step}: {seen[s.step]} and {s.source}")
            seen[s.step] = s.source
        if gate_path is not None and not isinstance(gate_path, GatePath):
            raise ValueError(f"gate_path must be a GatePath or None, got {type(gate_path).__name__}")
        if gate_path is not None and gate_path.mode != "learned" and gate_span is None:
            raise ValueError("a fixed or scheduled gate_path needs gate_span=(first_step, last_step)")
        self._snapshots: tuple[Snapshot, ...] = tuple(snaps)
        self._by_step = {s.step: s for s in snaps}
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.task = task
        self.gate_path = gate_path
        self.gate_span = None if gate_span is None else (int(gate_span[0]), int(gate_span[1]))
        if source is None:
            srcs = {s.source for s in snaps}
            source = srcs.pop() if len(srcs) == 1 else f"{len(snaps)} snapshots"
        self.source = source

    # -- sequence protocol ------------------------------------------------------------
    @property
    def snapshots(self) -> tuple[Snapshot, ...]:
        return self._snapshots

    @property
    def steps(self) -> list[int]:
        return [s.step for s in self._snapshots]

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[tuple[int, nn.Module]]:
        for snap in self._snapshots:
            model = _load_snapshot(snap)
            yield snap.step, model
            del model

    def __contains__(self, step) -> bool:
        return step in self._by_step

    def snapshot(self, step: int) -> Snapshot:
        """The :class:`Snapshot` at ``step`` (``KeyError`` listing the steps if absent)."""
        try:
            return self._by_step[step]
        except (KeyError, TypeError):
            raise KeyError(
                f"no checkpoint at step {step!r} in {self.source}; available steps: {_fmt_steps(self.steps, 50)}"
            ) from None

    def __getitem__(self, step: int) -> nn.Module:
        return _load_snapshot(self.snapshot(step))

    def __repr__(self) -> str:
        return f"CheckpointSeries({len(self)} snapshots, steps={_fmt_steps(self.steps)}, source={self.source!r})"

    # -- sub-series ----------------------------------------------------------------------
    def _sub(self, snaps: Iterable[Snapshot]) -> "CheckpointSeries":
        return CheckpointSeries(
            snaps, self.metadata, task=self.task, gate_path=self.gate_path, gate_span=self.gate_span,
            source=self.source,
        )

    def range(self, start: int | None = None, stop: int | None = None, every: int | None = None) -> "CheckpointSeries":
        """Snapshots with ``start <= step <= stop`` (both inclusive, ``None`` = unbounded)
        and, if ``every`` is given, ``(step - (start or 0)) % every == 0``."""
        if every is not None and (isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1):
            raise ValueError(f"every must be a positive integer, got {every!r}")
        origin = start if start is not None else 0
        keep = [
            s for s in self._snapshots
            if (start is None or s.step >= start)
            and (stop is None or s.step <= stop)
            and (every is None or (s.step - origin) % every == 0)
        ]
        return self._sub(keep)

    def select(self, steps: Iterable[int]) -> "CheckpointSeries":
        """The snapshots at exactly ``steps`` (``KeyError`` naming any step not present)."""
        steps = list(steps)
        missing = [s for s in steps if s not in self._by_step]
        if missing:
            raise KeyError(
                f"steps {missing} not in {self.source}; available steps: {_fmt_steps(self.steps, 50)}"
            )
        return self._sub(self._by_step[s] for s in dict.fromkeys(steps))

    # -- gate schedule -----------------------------------------------------------------
    def gate_value(self, step: int) -> float | None:
        """The gate value the run's path prescribes at ``step`` (``None`` for learned gates
        or series without a gate path)."""
        if self.gate_path is None or self.gate_path.mode == "learned":
            return None
        return self.gate_path.value_at(step)

    def gate_zero_step(self) -> int | None:
        """First training step ``s`` in ``gate_span`` with gate 0 at every step ``s..last``.

        A training step, not necessarily a checkpoint step. ``None`` for learned gates,
        series without a gate path, or a gate that is not 0 at the last step. For a
        path ``fade5+5->0`` (0.5 until 5, linear to 0 over 5 steps) it is 10; for
        ``forced_zero`` it is the first step of the span.
        """
        if self.gate_path is None or self.gate_path.mode == "learned" or self.gate_span is None:
            return None
        first, last = self.gate_span
        if self.gate_path.value_at(last) != 0.0:
            return None
        if self.gate_path.mode == "fixed":
            return first
        s = last
        while s > first and self.gate_path.value_at(s - 1) == 0.0:
            s -= 1
        return s


def _load_snapshot(snap: Snapshot) -> nn.Module:
    """``snap``'s model in eval mode; :class:`CheckpointError` naming the source and the parameter
    when a weight is NaN or inf (whatever the source kind: files, runs, revisions, models)."""
    model = snap.load()
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{snap.source}: loader returned {type(model).__name__}, not a torch model")
    check_finite(dict(model.named_parameters()), snap.source)
    return model.eval()
