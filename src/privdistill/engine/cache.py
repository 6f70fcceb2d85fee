"""Stage cache: expensive stages (baseline, teachers, generator, synthetic set, VAE) stored by a hash of
everything they depend on, so a sweep over ε trains its teachers and generator once.

A stage's key hashes its name and code `version` (bump it when a stage's semantics or options change), its whole
configuration, the dataset fingerprint, the seed and its upstream stages' keys. It is built in
`<root>/<name>-<key>.partial/` (resumable) and renamed only once `stage.json` is written; a file lock keeps two
processes from building the same stage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from privdistill.atomic import atomic_write_json
from privdistill.engine.run import RunDir

ENV_CACHE = "PRIVDISTILL_CACHE"
MARKER = "stage.json"


def default_cache_root() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "privdistill" / "stages"


def stage_key(name: str, version: str, material: dict[str, Any]) -> str:
    blob = json.dumps({"stage": name, "version": version, **material}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Stage:
    """A completed (or reused) stage: a directory with its artifacts and a `stage.json` description."""

    name: str
    key: str
    path: Path
    reused: bool

    @property
    def run(self) -> RunDir:
        return RunDir(self.path)

    def info(self) -> dict[str, Any]:
        return json.loads((self.path / MARKER).read_text())

    def ref(self) -> dict[str, Any]:
        """What a run records about the stages it used."""
        return {"stage": self.name, "key": self.key, "path": str(self.path), "reused": self.reused}


class StageCache:
    def __init__(self, root: str | os.PathLike | None = None, *, enabled: bool = True):
        self.root = Path(root).expanduser() if root else default_cache_root()
        self.enabled = enabled

    def get_or_build(self, name: str, version: str, material: dict[str, Any],
                     build: Callable[[RunDir], dict[str, Any]], *, private_dir: Path | None = None) -> Stage:
        """Return the stage for this key, building it with `build(run_dir) -> info` if needed.

        With the cache disabled, the stage is built in `private_dir` (inside the run) and never shared.
        """
        key = stage_key(name, version, material)
        if not self.enabled:
            assert private_dir is not None, "a disabled cache needs a private directory"
            return self._build_in(private_dir / f"{name}-{key}", name, key, version, material, build)
        final = self.root / f"{name}-{key}"
        if (final / MARKER).is_file():
            return Stage(name, key, final, reused=True)
        self.root.mkdir(parents=True, exist_ok=True)
        with _lock(self.root / f".{name}-{key}.lock"):
            if (final / MARKER).is_file():  # built by another process while we waited
                return Stage(name, key, final, reused=True)
            partial = self.root / f"{name}-{key}.partial"
            self._build_in(partial, name, key, version, material, build)
            if final.exists():
                shutil.rmtree(final)  # an incomplete directory without a marker: never reused
            os.replace(partial, final)
            return Stage(name, key, final, reused=False)

    @staticmethod
    def _build_in(directory: Path, name: str, key: str, version: str, material: dict[str, Any],
                  build: Callable[[RunDir], dict[str, Any]]) -> Stage:
        if (directory / MARKER).is_file():
            return Stage(name, key, directory, reused=True)
        run = RunDir.open(directory, config={"stage": name, "version": version, **material}, resume=True,
                          command=f"stage {name}")
        started = time.perf_counter()
        info = build(run) or {}
        info = {"stage": name, "key": key, "version": version, "build_seconds": round(time.perf_counter() - started, 1),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **info}
        atomic_write_json(directory / MARKER, info)
        return Stage(name, key, directory, reused=False)

    def entries(self) -> list[dict[str, Any]]:
        out = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                continue
            complete = (d / MARKER).is_file()
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            entry = {"name": d.name, "path": str(d), "complete": complete and not d.name.endswith(".partial"),
                     "bytes": size}
            if complete:
                info = json.loads((d / MARKER).read_text())
                entry.update(stage=info.get("stage"), created=info.get("created"),
                             build_seconds=info.get("build_seconds"))
            out.append(entry)
        return out

    def remove(self, pattern: str | None = None) -> list[str]:
        """Delete the stages whose name contains `pattern` (all without one). A stage another process is building
        right now (its writer lock is held) is left alone, with its lock: removing either would let a third
        process start the same build beside it."""
        removed = []
        for entry in self.entries():
            if pattern is None or pattern in entry["name"]:
                lock = self.root / f".{entry['name'].removesuffix('.partial')}.lock"
                if _held(lock):
                    continue
                shutil.rmtree(entry["path"], ignore_errors=True)
                removed.append(entry["name"])
        for lock in self.root.glob(".*.lock") if self.root.is_dir() else []:
            if (pattern is None or pattern in lock.name) and not _held(lock):
                lock.unlink(missing_ok=True)
        return removed


def _held(path: Path) -> bool:
    """Whether another process holds the writer lock at `path` (tried without waiting)."""
    if not path.is_file():
        return False
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


@contextmanager
def _lock(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
