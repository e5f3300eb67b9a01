"""Synthetic in-context retrieval tasks and their task registry.

Use :func:`make_task` to build a task by name (``"assoc"``, ``"markov"``) and
:func:`register_task` to add new ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from circuitfade.compat import deprecated_names

from .ambiguous import AmbiguousBatch, AmbiguousRecall, AmbiguousRecallConfig
from .assoc import AssocRecall, AssocRecallConfig
from .base import EVAL_SEED, EVAL_SIZE, IGNORE_INDEX, Batch, BatchTask, Task, eval_set
from .kpart import KPart, KPartConfig
from .linreg import LinearRegressionICL, LinRegConfig, RegressionBatch
from .markov import MarkovInduction, MarkovInductionConfig
from .repeats import Repeats, RepeatsConfig

TaskFactory = Callable[..., Task]

_REGISTRY: dict[str, TaskFactory] = {}


def config_factory(task_cls: Callable[[Any], Task], config_cls: type) -> TaskFactory:
    """Factory ``(**kwargs) -> task_cls(config_cls(**kwargs))`` that rejects unknown kwargs.

    Unknown keyword arguments raise ``ValueError`` naming them and listing the valid ones.
    """
    valid = [f.name for f in dataclasses.fields(config_cls)]

    def factory(**kwargs: Any) -> Task:
        unknown = sorted(set(kwargs) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown argument(s) {unknown} for {config_cls.__name__}; valid: {valid}"
            )
        return task_cls(config_cls(**kwargs))

    factory.__name__ = f"make_{getattr(task_cls, '__name__', 'task')}"
    return factory


def register_task(name: str, factory: TaskFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(**kwargs) -> Task`` under ``name`` for :func:`make_task`.

    Raises ``ValueError`` if ``name`` is already registered and ``overwrite`` is False.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"task name: expected a non-empty str, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory for task {name!r}: expected a callable, got {factory!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"task {name!r} is already registered (pass overwrite=True to replace)")
    _REGISTRY[name] = factory


def known_tasks() -> list[str]:
    """Sorted names of all registered tasks."""
    return sorted(_REGISTRY)


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the registered task ``name`` with config keyword arguments.

    Unknown names raise ``ValueError`` listing the known ones; for the built-in tasks
    unknown keyword arguments raise ``ValueError`` naming them.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; known tasks: {known_tasks()}")
    return _REGISTRY[name](**kwargs)


def parse_task_args(name: str, items: list[str] | None) -> dict:
    """``["key=value", ...]`` (the CLI's ``--task-arg``) as ``{"name": name, key: typed value}``.

    Each value is parsed by its field's type in the task's config dataclass
    (:func:`circuitfade.io.parse_typed`: int, float, bool as true/false, str as is,
    ``X | None`` with ``none``/``null``, tuples and lists); unknown keys, ``name=...``
    and items without ``=`` raise ``ValueError`` naming the problem. Used by
    ``circuitfade train`` and ``circuitfade analyze``.
    """
    import typing

    from circuitfade.io import parse_typed

    cfg = getattr(make_task(name), "config", None)  # unknown task names raise, listing the known ones
    types = typing.get_type_hints(type(cfg)) if dataclasses.is_dataclass(cfg) else None
    d: dict = {"name": name}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"--task-arg expects KEY=VALUE, got {item!r}")
        if k == "name":
            raise ValueError("--task-arg name: 'name' is the task itself; pass it as --task NAME")
        if types is not None and k not in types:
            raise ValueError(f"--task-arg {k}: task {name!r} has no parameter {k!r}; its parameters: {sorted(types)}")
        d[k] = parse_typed(f"--task-arg {k}", v, types[k]) if types is not None else parse_typed(k, v, typing.Any)
    return d


def as_task(task: Any) -> Task | None:
    """Whatever a user passes as a task, as a :class:`Task` (``None`` stays ``None``).

    Accepted: a :class:`Task`; a registered name (``"assoc"``); a dict
    ``{"name": "assoc", **config}`` (the form in a run's ``config.json``); a user's own
    :class:`Batch` (wrapped in :class:`BatchTask`, so evaluation uses exactly that batch).
    Anything else raises ``ValueError`` saying what is accepted.
    """
    if task is None or isinstance(task, Task):
        return task
    if isinstance(task, str):
        return make_task(task)
    if isinstance(task, dict):
        if "name" not in task:
            raise ValueError(f"task dict: expected a 'name' key (one of {known_tasks()}), got keys {sorted(task)}")
        kwargs = {k: v for k, v in task.items() if k != "name"}
        return make_task(task["name"], **kwargs)
    if isinstance(task, Batch):
        return BatchTask(task)
    raise ValueError(
        f"task: expected a Task, a task name ({known_tasks()}), a dict {{'name': ..., **config}} or a "
        f"circuitfade.tasks.Batch of your own, got {type(task).__name__}"
    )


register_task("assoc", config_factory(AssocRecall, AssocRecallConfig))
register_task("markov", config_factory(MarkovInduction, MarkovInductionConfig))
register_task("linreg", config_factory(LinearRegressionICL, LinRegConfig))
register_task("repeats", config_factory(Repeats, RepeatsConfig))
register_task("ambiguous", config_factory(AmbiguousRecall, AmbiguousRecallConfig))
register_task("kpart", config_factory(KPart, KPartConfig))

__all__ = [
    "AmbiguousBatch",
    "BatchTask",
    "EVAL_SEED",
    "EVAL_SIZE",
    "AmbiguousRecall",
    "AmbiguousRecallConfig",
    "IGNORE_INDEX",
    "KPart",
    "KPartConfig",
    "AssocRecall",
    "AssocRecallConfig",
    "Batch",
    "MarkovInduction",
    "MarkovInductionConfig",
    "LinearRegressionICL",
    "LinRegConfig",
    "RegressionBatch",
    "Task",
    "eval_set",
    "known_tasks",
    "make_task",
    "register_task",
]
"""``as_task`` and ``parse_task_args`` (what the analyses and the command line read a task
argument with) and ``config_factory`` are importable from here but not public."""

__getattr__ = deprecated_names(__name__, {"DEFAULT_EVAL_SEED": ("circuitfade.tasks", "EVAL_SEED")})
"""Names of the previous release (a ``DeprecationWarning`` names the replacement)."""
