"""Where the data and the model come from: ``MODULE:FACTORY`` callables or a folder."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iolens._errors import IolensError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset


class SpecError(IolensError):
    """A ``--dataset``, ``--model`` or ``--folder`` that cannot be used (a usage error)."""


@dataclass
class Source:
    """A dataset to measure, what it is called, and the files it reads where known."""

    dataset: Dataset[Any]
    name: str
    files: list[str]
    """The dataset's files (a folder's), whose pages a cold-cache measurement drops."""


def load_factory(spec: str, option: str) -> Callable[[], Any]:
    """The callable that ``MODULE:FACTORY`` names, imported with the current folder on sys.path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise SpecError(f"{option} {spec!r}: expected MODULE:FACTORY, for example "
                        "mypkg.data:make_dataset")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"{option} {spec!r}: cannot import {module_name} ({exc}); the module "
                        "must be importable from the current folder or the environment") from exc
    except Exception as exc:  # the user's module failed while it was imported
        raise SpecError(f"{option} {spec!r}: importing {module_name} failed: "
                        f"{type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{option} {spec!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{option} {spec!r}: {attr} is not callable (a function or class "
                        "that takes no arguments is expected)")
    return obj  # type: ignore[no-any-return]


def _call(factory: Callable[[], Any], spec: str, option: str) -> Any:
    try:
        return factory()
    except Exception as exc:  # the user's factory failed
        raise SpecError(f"{option} {spec!r}: calling it failed: "
                        f"{type(exc).__name__}: {exc}") from exc


def check_dataset(ds: object, what: str) -> Dataset[Any]:
    """``ds`` if it is a non-empty map-style torch Dataset; SpecError otherwise."""
    from torch.utils.data import Dataset, IterableDataset  # noqa: PLC0415

    if isinstance(ds, IterableDataset):
        raise SpecError(f"{what} returned an IterableDataset; a map-style Dataset "
                        "(__len__ and __getitem__) is needed to draw samples in any order")
    if not isinstance(ds, Dataset):
        raise SpecError(f"{what} returned a {type(ds).__name__}, not a "
                        "torch.utils.data.Dataset")
    try:
        n = len(ds)  # type: ignore[arg-type]
    except TypeError as exc:
        raise SpecError(f"{what} returned a Dataset without __len__") from exc
    if n == 0:
        raise SpecError(f"{what} returned an empty Dataset")
    return ds


def dataset_source(spec: str) -> Source:
    """The dataset that ``--dataset MODULE:FACTORY`` makes."""
    ds = _call(load_factory(spec, "--dataset"), spec, "--dataset")
    return Source(check_dataset(ds, f"--dataset {spec!r}"), spec, [])


@dataclass
class ModelStep:
    """A model and its loss, to run the training step (forward, backward, optimizer)."""

    model: torch.nn.Module
    loss_fn: Callable[..., Any]
    name: str


def model_step(spec: str) -> ModelStep:
    """The ``(model, loss_fn)`` pair that ``--model MODULE:FACTORY`` returns."""
    import torch  # noqa: PLC0415

    got = _call(load_factory(spec, "--model"), spec, "--model")
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise SpecError(f"--model {spec!r} returned a {type(got).__name__}; expected a pair "
                        "(model, loss_fn)")
    model, loss_fn = got
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"--model {spec!r}: the first of the pair is a {type(model).__name__}, "
                        "not a torch.nn.Module")
    if not callable(loss_fn):
        raise SpecError(f"--model {spec!r}: the second of the pair (the loss function) is not "
                        "callable")
    return ModelStep(model, loss_fn, spec)
