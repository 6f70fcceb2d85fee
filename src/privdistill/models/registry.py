"""Models by name: `create_model("paper-cnn", in_channels=1, num_classes=10, image_size=28)`.

Each entry has a kind (classifier, generator, vae) so that commands can list and validate what fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from privdistill.errors import ModelError

if TYPE_CHECKING:  # annotations only: the registry imports no torch, so config can check model names without it
    from torch import nn


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str  # "classifier" | "generator" | "vae"
    factory: Callable[..., nn.Module]
    description: str


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, *, kind: str, description: str):
    def decorator(factory: Callable[..., nn.Module]):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = ModelEntry(name, kind, factory, description)
        return factory

    return decorator


def list_models(kind: str | None = None) -> list[ModelEntry]:
    _ensure_loaded()
    return [e for e in _REGISTRY.values() if kind is None or e.kind == kind]


def get_entry(name: str, kind: str | None = None) -> ModelEntry:
    _ensure_loaded()
    entry = _REGISTRY.get(name)
    if entry is None or (kind is not None and entry.kind != kind):
        names = ", ".join(e.name for e in list_models(kind))
        what = f"{kind} model" if kind else "model"
        raise ModelError(f"unknown {what} {name!r}; available: {names}")
    return entry


def create_model(name: str, *, kind: str | None = None, **kwargs) -> nn.Module:
    entry = get_entry(name, kind)
    try:
        model = entry.factory(**kwargs)
    except TypeError as err:
        raise ModelError(f"model {name!r} cannot be built with {kwargs}: {err}") from err
    model.registry_name = name  # recorded in checkpoints so a run can rebuild its models
    model.registry_kwargs = dict(kwargs)
    return model


def _ensure_loaded() -> None:
    # The model modules register themselves on import, on the first lookup: they import this module (and torch,
    # which listing or checking a name does without), so this module cannot import them at its top.
    from privdistill.models import cnn, generator, resnet, scatternet, vae  # noqa: F401
