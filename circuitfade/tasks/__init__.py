"""Synthetic in-context retrieval tasks and their task registry.

Use :func:`make_task` to build a task by name (``"assoc"``, ``"markov"``) and
:func:`register_task` to add new ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .ambiguous import AmbiguousBatch, AmbiguousRecall, AmbiguousRecallConfig
from .assoc import AssocRecall, AssocRecallConfig
from .base import IGNORE_INDEX, Batch, Task, eval_set
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


register_task("assoc", config_factory(AssocRecall, AssocRecallConfig))
register_task("markov", config_factory(MarkovInduction, MarkovInductionConfig))
register_task("linreg", config_factory(LinearRegressionICL, LinRegConfig))
register_task("repeats", config_factory(Repeats, RepeatsConfig))
register_task("ambiguous", config_factory(AmbiguousRecall, AmbiguousRecallConfig))
register_task("kpart", config_factory(KPart, KPartConfig))

__all__ = [
    "AmbiguousBatch",
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
    "TaskFactory",
    "config_factory",
    "eval_set",
    "known_tasks",
    "make_task",
    "register_task",
]
