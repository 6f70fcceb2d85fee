"""A teacher the user brings: a run directory, a torch.save'd module, a torchvision model with weights, or an
in-memory nn.Module (Python API). Every source gives back the model, on the device and in eval mode, and a key
that identifies it (stages built on the teacher, e.g. a warm-start generator, are cached under that key).

A one-channel dataset can be fed to a three-channel teacher: the grey channel is repeated.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from privdistill.engine.run import RunDir
from privdistill.engine.stages import file_digest
from privdistill.errors import ConfigError, ModelError, RunError


@dataclass
class TeacherSpec:
    """Where the teacher comes from. All None: the method's own (e.g. DPDFD's cached baseline stage, the paper
    CNN trained on the private training set, shared with DGD and SRR)."""

    run_dir: Optional[str] = None  # a run directory with model.safetensors (e.g. from `train baseline`)
    module_file: Optional[str] = None  # a torch.save'd nn.Module (unpickled: trusted files only)
    torchvision: Optional[str] = None  # a torchvision model name, with `weights` (a state_dict file)
    weights: Optional[str] = None
    module: Optional[nn.Module] = None  # an in-memory model (Python API)
    # the pixel range the teacher was trained on, e.g. (0, 1) for torchvision's ToTensor; None: this package's
    # [-1, 1] (x / 127.5 - 1). Its inputs are mapped there linearly.
    input_range: Optional[tuple[float, float]] = None

    @classmethod
    def of(cls, teacher: nn.Module | str | Path | TeacherSpec | None) -> TeacherSpec:
        """A spec from what a Python caller passes: an nn.Module, a run directory (str or Path, e.g. from `train
        baseline`), a TeacherSpec, or None (the method's own teacher)."""
        if teacher is None or isinstance(teacher, TeacherSpec):
            return teacher or cls()
        if isinstance(teacher, nn.Module):
            return cls(module=teacher)
        return cls(run_dir=str(teacher))

    def given(self) -> bool:
        return any((self.run_dir, self.module_file, self.torchvision, self.module is not None))

    def describe(self) -> str:
        if self.module is not None:
            return f"in-memory {type(self.module).__name__}"
        if self.run_dir:
            return f"run {self.run_dir}"
        if self.module_file:
            return f"module {self.module_file}"
        if self.torchvision:
            return f"torchvision {self.torchvision} with {self.weights}"
        return "baseline stage"

    def describe_inputs(self) -> str:
        if self.input_range is None:
            return ""
        return f", inputs mapped to [{self.input_range[0]:g}, {self.input_range[1]:g}]"


def load_teacher(spec: TeacherSpec, *, dataset: str, channels: int, num_classes: int,
                 device: torch.device) -> tuple[nn.Module, str]:
    """A user-given teacher (on `device`, in eval mode) and a key identifying it."""
    given = ([x for x in (spec.run_dir, spec.module_file, spec.torchvision) if x]
             + [spec.module] * (spec.module is not None))
    if len(given) > 1:
        raise ConfigError("give one teacher: --teacher RUN_DIR, --teacher-module FILE or --torchvision NAME")
    if spec.module is not None:
        if not isinstance(spec.module, nn.Module):
            raise ModelError(f"teacher must be a torch nn.Module, got {type(spec.module).__name__}")
        model = copy.deepcopy(spec.module)  # moved to the device and set to eval below: leave the caller's alone
        key = _state_digest(model)
    elif spec.run_dir:
        model, key = _from_run_dir(spec.run_dir, dataset, device)
    elif spec.module_file:
        model, key = _from_module_file(Path(spec.module_file), device)
    else:
        model, key = _from_torchvision(spec, num_classes)
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is not None and conv.in_channels != channels:
        if channels == 1 and conv.in_channels == 3:
            model = _RepeatChannels(model, 3)
        else:
            raise ModelError(f"the teacher expects {conv.in_channels}-channel images; {dataset} has {channels}")
    if spec.input_range is not None:
        lo, hi = (float(v) for v in spec.input_range)
        if not lo < hi:
            raise ConfigError(f"the teacher's input range must be LO < HI, got {spec.input_range}")
        model, key = _InputRange(model, lo, hi), f"{key}-inputs{lo:g},{hi:g}"
    return model.to(device).eval(), key


class _InputRange(nn.Module):
    """Feeds this package's images in [-1, 1] to a teacher trained on [lo, hi] (a fixed linear map)."""

    def __init__(self, model: nn.Module, lo: float, hi: float):
        super().__init__()
        self.model, self.lo, self.hi = model, lo, hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x + 1) * ((self.hi - self.lo) / 2) + self.lo)


def _from_run_dir(run_dir: str, dataset: str, device: torch.device) -> tuple[nn.Module, str]:
    run = RunDir.existing(run_dir)
    name = next((w for w in ("model", "student") if run.has_weights(w)), None)
    if name is None:
        raise RunError(f"{run_dir} holds no model.safetensors (or student.safetensors)")
    trained_on = run.config().get("dataset")
    if trained_on and trained_on != dataset:
        raise ConfigError(f"the teacher in {run_dir} was trained on {trained_on}, not {dataset}; "
                          f"pass --dataset {trained_on}")
    return run.load_weights(name, device=device), file_digest(run.path / f"{name}.safetensors")


def _from_module_file(path: Path, device: torch.device) -> tuple[nn.Module, str]:
    if not path.is_file():
        raise ConfigError(f"teacher module file {path} does not exist")
    try:
        model = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # unpickling fails in many ways (bad magic, missing classes, truncation)
        raise ModelError(f"{path} is not a torch.save'd module: {type(err).__name__}: {err}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"{path} holds a {type(model).__name__}, not a torch nn.Module "
                         "(save it with torch.save(model, path))")
    return model, file_digest(path)


def _from_torchvision(spec: TeacherSpec, num_classes: int) -> tuple[nn.Module, str]:
    import torchvision

    if not spec.weights:
        raise ConfigError(f"--torchvision {spec.torchvision} needs --weights FILE (a state_dict for {num_classes} "
                          "classes): the teacher must be a model trained on YOUR private data")
    try:
        model = torchvision.models.get_model(spec.torchvision, weights=None, num_classes=num_classes)
    except (ValueError, TypeError) as err:
        raise ModelError(f"torchvision model {spec.torchvision!r}: {err}") from None
    try:
        state = torch.load(spec.weights, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ModelError(f"--weights {spec.weights} is not a torch state_dict file: {type(err).__name__}: "
                         f"{err}") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ModelError(f"{spec.weights} does not fit torchvision {spec.torchvision} with {num_classes} classes: "
                         f"{str(err).splitlines()[0]}") from None
    return model, file_digest(spec.weights)


class _RepeatChannels(nn.Module):
    """Feeds a one-channel batch to a three-channel model by repeating the grey channel."""

    def __init__(self, model: nn.Module, channels: int):
        super().__init__()
        self.model, self.channels = model, channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.expand(-1, self.channels, -1, -1) if x.shape[1] == 1 else x)


def _state_digest(model: nn.Module) -> str:
    """A key for an in-memory teacher (the stages built on it are cached under it): its weights' hash."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
