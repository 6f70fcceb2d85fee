"""A run directory: everything one run writes, laid out the same way for every method.

    config.yaml       resolved configuration (and the command that made it)
    metrics.jsonl     one JSON object per logged event, appended and flushed
    checkpoint.pt     training state for --resume, written atomically
    *.safetensors     weights of the released and intermediate models
    ledger.jsonl      privacy ledger (methods with a privacy mechanism)
    summary.json      the headline numbers; `--record` copies it to results/<preset>/
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import nn

from privdistill.atomic import atomic_torch_save, atomic_write_bytes, atomic_write_json, atomic_write_text
from privdistill.data import dataset_slug
from privdistill.errors import RunError
from privdistill.models import create_model
from privdistill.privacy.ledger import MARK_KEY, ledger_mark

SUMMARY_KEYS = ("method", "dataset", "preset", "test_accuracy", "baseline_accuracy", "epsilon_paper",
                "epsilon_strict", "delta", "wall_seconds", "device", "git_commit", "command")


# What a resumed run may change: the ledger's hard limit (the ledger records the change and keeps pricing every
# spend against the limit in force), and what only changes how the run is shown or where new runs would go (the
# progress display; runs_dir, unused once --run-dir names the run); everything else would mix two experiments.
CHANGEABLE_ON_RESUME = frozenset({"budget.max_epsilon", "run.progress", "run.runs_dir"})

# The format of the configuration a run's config.yaml records (2: every option of every section, set or not). A run
# written in another format whose configuration differs from this code's is not resumed: the two cannot be told apart.
CONFIG_VERSION = 2


def git_commit() -> str | None:
    """The commit of the code that ran (with '-dirty' if it had uncommitted changes), if in a checkout; else
    $PRIVDISTILL_GIT_COMMIT (set by whoever installed a copy without .git, e.g. scripts/device_session.sh)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return os.environ.get("PRIVDISTILL_GIT_COMMIT") or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("PRIVDISTILL_GIT_COMMIT") or None


def command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(("privdistill", "__main__.py")):
        argv[0] = "privdistill"
    return " ".join(shlex.quote(a) for a in argv)


# ------------------------------------------------------------------------------------------ run lock
LOCK_NAME = ".lock"
_HELD: dict[str, int] = {}  # run directories this process holds: real path -> the locked file descriptor


def make_run_dir(path: Path) -> None:
    """mkdir -p, with an error that names the run directory (a read-only or non-existent place, e.g. /proc)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot create the run directory {path}: {err.strerror or err}; choose another --run-dir") \
            from None


def lock_run_dir(path: str | os.PathLike) -> None:
    """Hold an exclusive lock on a run directory until `unlock_run_dir` (or the process ends).

    Two processes on one run would each draw fresh noise for the same records and each spend the budget, and
    the ledger would record both: the second process is refused here, before it reads or writes anything.
    The same process may take the lock again (a retry from Python after a crash keeps it)."""
    path = Path(path)
    make_run_dir(path)
    key = os.path.realpath(path)
    if key in _HELD:
        return
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunError(f"run directory {path} is in use by another process (pid {owner}); wait for it to "
                       "finish, or choose another --run-dir. Two processes on one run would spend its "
                       "budget twice") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[key] = fd


def unlock_run_dir(path: str | os.PathLike) -> None:
    fd = _HELD.pop(os.path.realpath(path), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors.torch.save, with the header's metadata in sorted key order (safetensors writes a Rust HashMap's
    order, which changes per process, so equal weights got two digests and stages keyed by them were rebuilt). The
    format: an 8-byte little-endian header length, the JSON header (space-padded to a multiple of 8), the data."""
    raw = save(tensors, metadata=metadata)
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    ordered = {"__metadata__": dict(sorted(header.pop("__metadata__", {}).items())), **header}
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + raw[8 + length:]


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # -------------------------------------------------------------------------------- creation / resume
    @classmethod
    def open(cls, path: str | os.PathLike, *, config: dict[str, Any], resume: bool = False,
             command: str | None = None) -> "RunDir":
        """Create a new run directory, or re-open one with `resume=True`.

        Resuming with a different configuration would silently mix two experiments (and two privacy
        budgets), so it is refused; the differing keys are listed.
        """
        run = cls(path)
        cfg_path = run.path / "config.yaml"
        abandoned = cfg_path.exists() and _abandoned_before_doing_anything(run.path)
        if abandoned:
            # An earlier attempt stopped at a check before doing anything: nothing to protect or resume, so a
            # corrected command (or the same one with --resume, as the bench retries a failed cell) starts afresh.
            for leftover in ("config.yaml", "ledger.jsonl"):
                (run.path / leftover).unlink(missing_ok=True)
        if cfg_path.exists():
            if not resume:
                raise RunError(f"run directory {run.path} already holds a run; pass --resume to continue it "
                               "or choose another --run-dir")
            previous = yaml.safe_load(cfg_path.read_text()) or {}
            diff = [k for k in _diff(previous.get("config", {}), json.loads(json.dumps(config)))
                    if k not in CHANGEABLE_ON_RESUME]
            written = previous.get("config_version", 1)
            if diff and written != CONFIG_VERSION:
                raise RunError(f"cannot resume {run.path}: it was started by another version of privdistill, whose "
                               f"config.yaml (format {written}; this one writes {CONFIG_VERSION}) records the "
                               "options differently and whose cached stages this one does not reuse. Start the run "
                               "afresh in another --run-dir (what its ledger recorded stays spent), or finish it "
                               "with the privdistill that started it")
            if diff:
                raise RunError(f"cannot resume {run.path}: its configuration differs in {', '.join(diff)}")
        else:
            if resume and not abandoned and run.path.exists() and {p.name for p in run.path.iterdir()} - {LOCK_NAME}:
                raise RunError(f"--resume given but {run.path} has no config.yaml: not a run directory")
            make_run_dir(run.path)
            doc = {"command": command or command_line(), "created": datetime.now(timezone.utc).isoformat(),
                   "host": socket.gethostname(), "pid": os.getpid(), "config_version": CONFIG_VERSION,
                   "config": json.loads(json.dumps(config))}
            atomic_write_text(cfg_path, yaml.safe_dump(doc, sort_keys=False))
        return run

    @classmethod
    def existing(cls, path: str | os.PathLike) -> "RunDir":
        run = cls(path)
        if not (run.path / "config.yaml").is_file():
            raise RunError(f"{run.path} is not a run directory (no config.yaml)")
        return run

    def config(self) -> dict[str, Any]:
        return (yaml.safe_load((self.path / "config.yaml").read_text()) or {}).get("config", {})

    def command(self) -> str:
        return (yaml.safe_load((self.path / "config.yaml").read_text()) or {}).get("command", "")

    # --------------------------------------------------------------------------------------- metrics
    def log(self, **metrics: Any) -> None:
        metrics = {"time": round(time.time(), 3), **metrics}
        with open(self.path / "metrics.jsonl", "a") as f:  # closed, so flushed, at each entry
            f.write(json.dumps(metrics, default=float) + "\n")

    def metrics(self) -> list[dict[str, Any]]:
        p = self.path / "metrics.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash
        return out

    # --------------------------------------------------------------------------------------- weights
    def save_weights(self, name: str, module: nn.Module, metadata: dict[str, str] | None = None) -> Path:
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        meta = {"registry_name": getattr(module, "registry_name", ""),
                "registry_kwargs": json.dumps(getattr(module, "registry_kwargs", {})), **(metadata or {})}
        path = self.path / f"{name}.safetensors"
        atomic_write_bytes(path, safetensors_bytes(state, meta))
        return path

    def has_weights(self, name: str) -> bool:
        return (self.path / f"{name}.safetensors").is_file()

    def weights_metadata(self, name: str) -> dict[str, str]:
        """The metadata stored with `name`.safetensors (the registry name and arguments, and what else was saved)."""
        path = self.path / f"{name}.safetensors"
        if not path.is_file():
            raise RunError(f"{path} not found: the run did not finish this stage")
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})

    def load_weights(self, name: str, module: nn.Module | None = None, device: str | torch.device = "cpu") -> nn.Module:
        """Load weights into `module`, or rebuild the module from the registry metadata stored with them. Weights
        that do not fit the module (e.g. saved by another version of an architecture) are a RunError."""
        path = self.path / f"{name}.safetensors"
        meta = self.weights_metadata(name)
        if module is None:
            if not meta.get("registry_name"):
                raise RunError(f"{path} carries no model name; pass the module to load it into")
            module = create_model(meta["registry_name"], **json.loads(meta.get("registry_kwargs", "{}")))
        try:
            module.load_state_dict(load_file(str(path), device=str(device)))
        except RuntimeError as err:
            lines = str(err).splitlines()
            raise RunError(f"{path}: the weights do not fit the architecture {meta.get('registry_name') or 'given'} "
                           f"({lines[1].strip() if len(lines) > 1 else lines[0]}); were they made by another "
                           "version of privdistill?") from None
        return module.to(device)

    # ------------------------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, name: str = "checkpoint") -> Path:
        return self.path / f"{name}.pt"

    def save_checkpoint(self, state: dict[str, Any], name: str = "checkpoint") -> None:
        """Write a checkpoint (`name` ends in "checkpoint": the ledger looks for ``*checkpoint.pt``), stamped with
        the privacy ledger's mark: how many spends it held. A ledger later found to hold fewer lost a record this
        checkpoint's state was computed from, and is refused (privacy/ledger.py)."""
        mark = ledger_mark(self.path)
        atomic_torch_save(self.checkpoint_path(name), state if mark is None else {**state, MARK_KEY: mark})

    def load_checkpoint(self, name: str = "checkpoint") -> dict[str, Any] | None:
        p = self.checkpoint_path(name)
        if not p.is_file():
            return None
        try:
            return torch.load(p, map_location="cpu", weights_only=False)
        except OSError:  # the file is there but cannot be opened (permissions): said as such by the CLI
            raise
        except Exception as err:  # noqa: BLE001 - a cut or damaged file: torch raises RuntimeError, EOFError, ...
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise RunError(f"{p} cannot be read ({reason[:160]}): it is this run's record of the training done so far "
                           "(for DP-SGD, Opacus's accountant: the privacy it spent). Resuming without it would train, "
                           "and spend, again; nothing was changed: restore the file from a backup, or start a new "
                           "--run-dir") from None

    def remove_checkpoint(self, name: str = "checkpoint") -> None:
        self.checkpoint_path(name).unlink(missing_ok=True)

    # ---------------------------------------------------------------------------------------- summary
    def write_summary(self, **fields: Any) -> dict[str, Any]:
        summary = {**dict.fromkeys(SUMMARY_KEYS), "git_commit": git_commit(), "command": self.command(), **fields,
                   "run_dir": str(self.path), "finished": datetime.now(timezone.utc).isoformat()}
        if summary.get("warning"):  # e.g. a model at chance (methods/chance.py): the summary's first line says so
            summary = {"warning": summary.pop("warning"), **summary}
        atomic_write_json(self.path / "summary.json", summary)
        return summary

    def summary(self) -> dict[str, Any]:
        p = self.path / "summary.json"
        if not p.is_file():
            raise RunError(f"{self.path} has no summary.json: the run has not finished")
        return json.loads(p.read_text())


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [prefix.rstrip(".")] if a != b else []


def record_result(summary: dict[str, Any], *, results_dir: str | os.PathLike = "results",
                  name: str | None = None) -> Path:
    """Copy a run's summary to results/<preset>/<method>-<dataset>[-eps<ε>][-<recipe>][-<variant>].json (small
    JSON, no weights). The recipe is named unless it is `paper`: the paper-literal cells keep the names of the seed
    tables they were recorded under before recipes existed, and a default run (`-default`) never takes one's name."""
    preset = summary.get("preset") or "custom"
    if name is None:
        # a named recipe's file bears the command's name (DGD's Gaussian-vote runs report "dgd+": the recipe
        # already says which configuration it is)
        named_recipe = summary.get("recipe") not in (None, "paper")
        method = summary["method"].rstrip("+") if named_recipe else summary["method"]
        name = f"{method}-{dataset_slug(summary['dataset'])}"
        if summary.get("target_epsilon") is not None:
            name += f"-eps{summary['target_epsilon']:g}"
        if named_recipe:
            name += f"-{summary['recipe']}"
        if summary.get("variant"):  # ablations and sweeps: dgd-mnist-eps10-no-tangent.json
            name += f"-{summary['variant']}"
    path = Path(results_dir) / preset / f"{name}.json"
    atomic_write_json(path, summary)
    return path


def _abandoned_before_doing_anything(path: Path) -> bool:
    """True if a run directory holds only its config.yaml (and a privacy ledger with no spending), written
    by a process that is no longer running: an attempt that stopped at a check. A live process's directory
    (a run still in its first epoch has written nothing else yet) is never taken over."""
    names = {p.name for p in path.iterdir()}
    if not names <= {"config.yaml", "ledger.jsonl", LOCK_NAME}:
        return False
    ledger = path / "ledger.jsonl"
    if ledger.exists() and any('"spend"' in line for line in ledger.read_text().splitlines()):
        return False
    doc = yaml.safe_load((path / "config.yaml").read_text()) or {}
    pid, host = doc.get("pid"), doc.get("host")
    if pid is None or host != socket.gethostname():
        return False  # owner unknown or on another machine: cannot tell whether it still runs
    if pid == os.getpid():
        return True  # written earlier by this very process (a retry from Python)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False
