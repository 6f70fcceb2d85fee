"""The privacy ledger: an append-only record of every mechanism use of a run.

``RUN_DIR/ledger.jsonl`` holds a header (format version, neighbouring relation, accounting, delta), one ``spend``
record per mechanism use (key, event, the released answers, inline or in an atomically written side ``.npy`` under
``ledger_answers/`` referenced by SHA-256, summaries of the data-dependent statistics, ε after the spend under both
accountings, a timestamp), and ``config`` records when a resumed run changes ``max_epsilon``.

Every record is fsync'ed before :meth:`PrivacyLedger.spend` returns the answers, so an answer that was used is on
disk; a resumed run gets the recorded answers back for the same keys without spending again, and a new key is priced
against the budget *before* its answers are computed. The ledger and the run agree, or the run stops: a torn last
line whose answers were never returned is cut off with a warning; a committed side file no record references, or a
checkpoint (stamped by :func:`ledger_mark`) written after more spends than the ledger holds, means a used record is
gone, and every reader refuses (RunError). The full protocol: research log, "Notes that left the code:
privacy/ledger.py".

The ledger and its side files hold data-dependent statistics of the private data (vote histograms): keep them with
the run, do not publish them (the privacy report does not include them).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import re
import sys
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from privdistill.atomic import atomic_write_bytes, fsync_dir
from privdistill.errors import BudgetExceededError, PrivacyError, RunError
from privdistill.privacy._checks import check_accounting, check_delta, check_positive
from privdistill.privacy.accounting import REPLACE_ONE, EpsilonResult, VoteStats, both, epsilon, json_num, merge_events
from privdistill.privacy.events import PrivacyEvent, as_events, event_from_dict

FORMAT_VERSION = 1
LEDGER_NAME = "ledger.jsonl"
SIDE_DIR = "ledger_answers"
#: arrays with more elements than this go to a side .npy file instead of the JSON line
INLINE_LIMIT = 256
#: a side file's name until its record is on disk (then renamed to the name the record gives)
PENDING = ".pending"
#: the key under which a checkpoint carries the ledger's state when it was written (RunDir.save_checkpoint)
MARK_KEY = "ledger_mark"


class LedgerWarning(UserWarning):
    """A recoverable problem with a ledger (e.g. a torn last line after a crash)."""


@dataclass
class LedgerAnswer:
    """What ``compute_answers`` may return to record more than the bare answers.

    ``answers``: what the mechanism released (tensor, array, list, number, or a dict of those);
    ``votes``: the vote histograms [count, K] the answers were computed from (PATE events; kept in a
    side file for the optional data-dependent accounting); ``answered``: Confident-GNMax's mask;
    ``stats``: any other JSON-able data-dependent summary.
    """

    answers: Any
    votes: Any = None
    answered: Any = None
    stats: dict[str, Any] | None = None


# ================================================================================== (de)serialising
def _to_numpy(value: Any) -> tuple[np.ndarray, str] | None:
    """(array, kind) for tensors and arrays; None for anything else."""
    torch = sys.modules.get("torch")  # not imported means the value cannot be a tensor
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy(), "tensor"
    if isinstance(value, np.ndarray):
        return value, "ndarray"
    return None


class _Codec:
    """Encodes answers to JSON (big arrays to side files) and back."""

    def __init__(self, root: Path, side_dir: Path):
        self.root = root
        self.side_dir = side_dir
        self.pending: list[Path] = []  # side files written for the record being encoded, renamed once it is on disk

    def encode(self, value: Any, stem: str) -> Any:
        if isinstance(value, dict):
            return {"__dict__": {str(k): self.encode(v, f"{stem}.{_safe(str(k))}") for k, v in value.items()}}
        if isinstance(value, (list, tuple)) and any(_to_numpy(v) is not None for v in value):
            return {"__list__": [self.encode(v, f"{stem}.{i}") for i, v in enumerate(value)]}
        conv = _to_numpy(value)
        if conv is None:
            try:
                json.dumps(value)
            except (TypeError, ValueError) as err:
                raise PrivacyError(f"ledger answers must be tensors, arrays or JSON-able values: {err}") from None
            return {"__json__": value}
        arr, kind = conv
        arr = np.ascontiguousarray(arr)
        if arr.dtype == object:
            raise PrivacyError("ledger answers cannot be object arrays")
        head = {"__array__": kind, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if arr.size <= INLINE_LIMIT:
            if arr.dtype.kind in "iub":  # integers and booleans: readable and exact as a JSON list
                return {**head, "values": arr.reshape(-1).tolist()}
            return {**head, "b64": base64.b64encode(arr.tobytes()).decode("ascii")}
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getvalue()
        path = self.side_dir / f"{stem}.npy"
        atomic_write_bytes(_pending(path), data)
        self.pending.append(_pending(path))
        return {**head, "file": path.relative_to(self.root).as_posix(), "sha256": hashlib.sha256(data).hexdigest()}

    def decode(self, value: Any, map_location: Any = None) -> Any:
        if not isinstance(value, dict):
            return value
        if "__dict__" in value:
            return {k: self.decode(v, map_location) for k, v in value["__dict__"].items()}
        if "__list__" in value:
            return [self.decode(v, map_location) for v in value["__list__"]]
        if "__json__" in value:
            return value["__json__"]
        if "__array__" in value:
            if "values" in value:
                arr = np.asarray(value["values"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
            elif "b64" in value:
                arr = np.frombuffer(base64.b64decode(value["b64"]), dtype=np.dtype(value["dtype"]))
                arr = arr.reshape(value["shape"]).copy()
            else:
                path = self.root / value["file"]
                try:
                    # still pending: the record is on disk, the rename after it was interrupted
                    data = (path if path.exists() or not _pending(path).exists() else _pending(path)).read_bytes()
                except OSError as err:
                    raise RunError(f"ledger side file {path} is missing or unreadable ({err}); the recorded "
                                   "answers cannot be restored") from None
                if hashlib.sha256(data).hexdigest() != value["sha256"]:
                    raise RunError(f"ledger side file {path} does not match its recorded checksum")
                arr = np.load(io.BytesIO(data), allow_pickle=False)
            if value["__array__"] == "tensor":
                import torch

                t = torch.from_numpy(arr)
                return t.to(map_location) if map_location is not None else t
            return arr
        return value


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def _pending(path: Path) -> Path:
    return path.with_name(path.name + PENDING)


def _side_files(value: Any) -> set[str]:
    """The side files (paths relative to the run directory) a record references."""
    if isinstance(value, dict):
        out = {value["file"]} if "__array__" in value and isinstance(value.get("file"), str) else set()
        for v in value.values():
            out |= _side_files(v)
        return out
    if isinstance(value, list):
        return set().union(*map(_side_files, value)) if value else set()
    return set()


def _vote_summary(votes: np.ndarray) -> dict[str, Any]:
    """Aggregate summaries only (counts of agreement), for the record; the histograms go to a side file."""
    v = np.asarray(votes, dtype=float)
    if v.ndim != 2 or v.size == 0:
        return {}
    srt = np.sort(v, axis=1)
    total = v.sum(axis=1)
    frac = np.divide(srt[:, -1], total, out=np.zeros_like(total), where=total > 0)
    return {"queries": int(v.shape[0]), "classes": int(v.shape[1]),
            "mean_top_fraction": float(frac.mean()), "mean_top_gap": float((srt[:, -1] - srt[:, -2]).mean()),
            "unanimous": int(np.sum(srt[:, -2] == 0))}


# ========================================================================= ledger and run agreement
def _checkpoint_marks(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The ledger marks of the run directory's checkpoints (RunDir names them ``*checkpoint.pt``)."""
    found = sorted(root.glob("*checkpoint.pt"))
    if not found:
        return []
    import torch

    marks = []
    for path in found:
        try:  # mmap: the weights are never read, only the small mark beside them
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception:  # noqa: BLE001 - unreadable: RunDir.load_checkpoint refuses it when the run reads it
            continue
        mark = state.get(MARK_KEY) if isinstance(state, dict) else None
        if isinstance(mark, dict) and isinstance(mark.get("spends"), int):
            marks.append((path, mark))
    return marks


@dataclass
class _Evidence:
    """What a run directory holds that proves spends besides the ledger: committed side files (renamed only once
    their record was on disk) and its checkpoints' ledger marks. Gathered *before* the ledger is read, so a spend
    completing meanwhile (a report read during a run) is never taken for a missing record."""

    committed: set[str]
    marks: list[tuple[Path, dict[str, Any]]]

    @classmethod
    def gather(cls, path: Path) -> "_Evidence":
        if path.name != LEDGER_NAME:  # a ledger of another name shares its directory's side files: no evidence
            return cls(set(), [])
        side = path.parent / SIDE_DIR
        committed = {f"{SIDE_DIR}/{f.name}" for f in side.glob("*.npy")} if side.is_dir() else set()
        return cls(committed, _checkpoint_marks(path.parent))

    def check(self, path: Path, spends: list[dict[str, Any]], torn: bytes | None, *, missing: bool = False) -> None:
        """RunError if the run used answers that no complete spend record of the ledger holds."""
        referenced = set().union(*(_side_files(rec) for rec in spends))
        orphans = sorted(self.committed - referenced)
        past = [(p, m) for p, m in self.marks if m["spends"] > len(spends)]
        if not orphans and not past:
            return
        found = []
        if orphans:
            more = f" and {len(orphans) - 3} more" if len(orphans) > 3 else ""
            found.append(f"{', '.join(orphans[:3])}{more} hold{'s' * (len(orphans) == 1)} the answers of a spend "
                         "that no complete record references")
        for p, m in past:
            last = f", the last {m['last']!r}" if m.get("last") else ""
            found.append(f"{p.name} was written after {m['spends']} recorded spend(s){last}")
        state = ("does not exist" if missing else f"holds {len(spends)} complete spend record(s)"
                 + (f" and its last line is cut ({len(torn)} bytes)" if torn is not None else ""))
        raise RunError(
            f"{path} {state}, but {'; '.join(found)}: the record of answers this run has used is missing (the ledger "
            "was cut, edited or replaced by an older copy). The recorded answers and the checkpoints are the evidence "
            "of the spend, so nothing was changed and the run is neither resumed nor reported from this ledger: "
            f"restore {path.name} from a backup (or undo the edit) and try again, or start a new --run-dir (what this "
            "one spent stays spent); do not delete the answer files or checkpoints to get past this")


@dataclass
class _LedgerFile:
    """A ledger file as :func:`_read_ledger` read it."""

    records: list[tuple[dict[str, Any], PrivacyEvent | None]]  # every complete record, with a spend's event
    size: int  # the file's size in bytes
    good_end: int  # where the complete lines end (a torn last line starts there)
    add_newline: bool  # the last record is complete but its newline was never written

    def spends(self) -> list[dict[str, Any]]:
        return [rec for rec, event in self.records if event is not None]


def _read_ledger(path: Path) -> _LedgerFile | None:
    """The records of the ledger at ``path`` (None if there is none), for :class:`PrivacyLedger` and
    :class:`LedgerView`: one per line, each spend's event read and its key refused if already recorded, and the
    run directory's evidence of spends checked against them (:class:`_Evidence`). A last line that does not parse
    was torn while appending: ignored with a warning (the evidence shows whether its answers were used); any other
    unreadable line is a RunError."""
    evidence = _Evidence.gather(path)  # before the ledger itself (see _Evidence)
    if not path.exists():
        evidence.check(path, [], None, missing=True)
        return None
    raw = path.read_bytes()
    records: list[tuple[dict[str, Any], PrivacyEvent | None]] = []
    seen: set[str] = set()
    good_end, torn, add_newline = 0, None, False
    lines = raw.split(b"\n")
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line.strip():
            if not last:
                good_end += len(line) + 1
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
            if not isinstance(rec, dict) or "kind" not in rec:
                raise ValueError("not a ledger record")
        except (ValueError, UnicodeDecodeError) as err:
            if last:  # torn while appending: harmless unless the run holds evidence of it (checked below)
                torn = line
                break
            raise RunError(f"{path} line {i + 1} is corrupt ({err}); the ledger cannot be trusted. "
                           "Restore it from a backup; do not delete it (that would forget spent budget)") from None
        event = None
        if rec["kind"] == "spend":
            try:
                key, event = rec["key"], event_from_dict(rec["event"])
            except (PrivacyError, KeyError, TypeError) as err:
                raise RunError(f"{path} line {i + 1}: unreadable event ({err})") from None
            if key in seen:  # each key is spent once: a repeat means two writers (or an edit)
                raise RunError(f"{path} line {i + 1}: key {key!r} is recorded twice (two processes wrote this "
                               "ledger, or it was edited); the ledger cannot be trusted")
            seen.add(key)
        # a complete JSON object without its newline (last) is kept, and the file ended properly
        add_newline = last
        good_end += len(line) + (0 if last else 1)
        records.append((rec, event))
    read = _LedgerFile(records, len(raw), good_end, add_newline)
    evidence.check(path, read.spends(), torn)  # nothing is repaired in a ledger that lost a record
    if torn is not None:  # a crash while appending, and nothing of the run says its answers were used
        warnings.warn(f"{path}: ignoring an incomplete last record ({len(torn)} bytes) left by an interrupted "
                      "write; its answers were never used", LedgerWarning, stacklevel=4)
    return read


#: the ledger each run directory is written through in this process (ledger_mark reads its count, not the file)
_WRITERS: "weakref.WeakValueDictionary[str, PrivacyLedger]" = weakref.WeakValueDictionary()


def ledger_mark(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """What a checkpoint of ``run_dir`` records of its ledger (RunDir.save_checkpoint): the number of spends it held
    when the checkpoint was written, and the last key; None without a ledger. A ledger later found to hold fewer
    spends than a checkpoint's mark lost a record the run used: every reader refuses it."""
    path = Path(run_dir) / LEDGER_NAME
    if not path.exists():
        return None
    led = _WRITERS.get(os.path.realpath(path))
    if led is not None and led._end == path.stat().st_size:
        keys = led.keys()
    else:  # no writer here (or the file changed under it): read what is on disk
        keys = [key for key, _ in LedgerView.read(path).spends]
    return {"spends": len(keys), "last": keys[-1] if keys else None}


# ======================================================================================= the ledger
class PrivacyLedger:
    """Append-only privacy ledger of one run (see the module docstring).

    ``path``: the ledger file (a ``.jsonl`` path), or a run directory (then ``RUN_DIR/ledger.jsonl``).
    ``max_epsilon``: refuse any spend that would take epsilon (under ``accounting``, at ``delta``)
    above this; None = no limit (still recorded).
    """

    def __init__(self, path: str | os.PathLike, *, max_epsilon: float | None = None,
                 accounting: str = "strict", delta: float = 1e-5):
        path = Path(path)
        if path.suffix != ".jsonl":  # a run directory (existing or not)
            path = path / LEDGER_NAME
        self.path = path
        self.root = path.parent
        self.accounting = check_accounting(accounting)
        self.delta = check_delta(delta)
        self.max_epsilon = None if max_epsilon is None else check_positive("max_epsilon", max_epsilon)
        self._codec = _Codec(self.root, self.root / SIDE_DIR)
        self._records: list[dict[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}
        self._events: list[PrivacyEvent] = []
        self._header: dict[str, Any] | None = None
        self._end = 0  # the file's size as this ledger wrote or read it
        self._load()
        _WRITERS[os.path.realpath(self.path)] = self
        if self._header is None:
            self._write_header()
        elif self._config_max() != self.max_epsilon:
            self._append({"kind": "config", "max_epsilon": self.max_epsilon, "time": _now()})

    # ------------------------------------------------------------------------------------- loading
    def _load(self) -> None:
        read = _read_ledger(self.path)
        if read is None:
            return
        for rec, event in read.records:
            self._accept(rec, event)
        if read.add_newline or read.good_end != read.size:  # cut a torn last line, or end the last record
            with open(self.path, "r+b") as f:
                f.truncate(read.good_end)
                if read.add_newline:
                    f.seek(0, os.SEEK_END)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
        self._end = read.good_end + (1 if read.add_newline else 0)
        self._settle_pending(read.spends())

    def _settle_pending(self, spends: list[dict[str, Any]]) -> None:
        """Side files still pending: those of a complete record are committed (the run stopped between its line
        and the rename), the others removed (a spend interrupted before its line: its answers were never used)."""
        side = self.root / SIDE_DIR
        if self.path.name != LEDGER_NAME or not side.is_dir():
            return
        referenced = set().union(*(_side_files(rec) for rec in spends))
        pending_files = list(side.glob("*.npy" + PENDING))
        for pending in pending_files:
            final = pending.with_name(pending.name[:-len(PENDING)])
            if f"{SIDE_DIR}/{final.name}" in referenced and not final.exists():
                os.replace(pending, final)
            else:
                pending.unlink()
        if pending_files:
            fsync_dir(side)

    def _commit(self, pending: list[Path]) -> None:
        """Rename a recorded spend's side files to their final names: from now on they prove the record."""
        for path in pending:
            os.replace(path, path.with_name(path.name[:-len(PENDING)]))
        if pending:
            fsync_dir(pending[0].parent)

    def _accept(self, rec: dict[str, Any], event: PrivacyEvent | None) -> None:
        kind = rec["kind"]
        if kind == "header":
            if rec.get("version") != FORMAT_VERSION:
                raise RunError(f"{self.path}: ledger format version {rec.get('version')} is not supported")
            if rec.get("accounting") != self.accounting or not math.isclose(rec.get("delta", -1), self.delta):
                raise RunError(f"{self.path} was created with accounting={rec.get('accounting')}, "
                               f"delta={rec.get('delta')}; it cannot be continued with accounting={self.accounting}, "
                               f"delta={self.delta} (the budget would change meaning mid-run)")
            self._header = rec
        elif event is not None:
            self._by_key[rec["key"]] = rec
            self._events.append(event)
        self._records.append(rec)

    def _config_max(self) -> float | None:
        for rec in reversed(self._records):
            if rec["kind"] == "config":
                return rec.get("max_epsilon")
        return self._header.get("max_epsilon") if self._header else None

    # ------------------------------------------------------------------------------------- writing
    def _append(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, sort_keys=True, allow_nan=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "ab") as f:
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
            self._end = f.tell()
        if new:
            fsync_dir(self.path.parent)
        self._records.append(rec)

    def _write_header(self) -> None:
        self._header = {"kind": "header", "version": FORMAT_VERSION, "relation": REPLACE_ONE,
                        "accounting": self.accounting, "delta": self.delta, "max_epsilon": self.max_epsilon,
                        "time": _now(),
                        "note": "contains data-dependent statistics of the private data: do not publish"}
        self._append(self._header)

    # ------------------------------------------------------------------------------------- queries
    def events(self) -> list[PrivacyEvent]:
        """All recorded events, in order."""
        return list(self._events)

    def records(self) -> list[dict[str, Any]]:
        """All records (header, spends, config changes), as parsed JSON."""
        return [dict(r) for r in self._records]

    def keys(self) -> list[str]:
        return list(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._events)

    def epsilon(self, *, delta: float | None = None, accounting: str | None = None,
                data_dependent: bool = False) -> EpsilonResult:
        """Epsilon spent so far (default: the ledger's accounting and delta)."""
        stats = self.vote_stats() if data_dependent else None
        events = self._events if data_dependent else merge_events(self._events)
        return epsilon(events, delta=self.delta if delta is None else delta,
                       accounting=self.accounting if accounting is None else accounting, stats=stats,
                       breakdown=False)

    def epsilon_both(self, *, delta: float | None = None,
                     planned: Sequence[PrivacyEvent] = ()) -> dict[str, EpsilonResult]:
        """Both accountings, events of the same setting merged (one breakdown row per mechanism). ``planned``: events
        not spent yet, priced as if recorded (a dry run's ε is what its run will report, priced the same way)."""
        return both(merge_events(self._events + as_events(planned)), delta=self.delta if delta is None else delta)

    def remaining(self, *, delta: float | None = None, accounting: str | None = None) -> float | None:
        """max_epsilon minus the epsilon spent (None without a max_epsilon; never negative)."""
        if self.max_epsilon is None:
            return None
        return max(0.0, self.max_epsilon - self.epsilon(delta=delta, accounting=accounting).value)

    def vote_stats(self) -> list[VoteStats | None]:
        """Per event, the recorded vote histograms (for the data-dependent PATE accounting)."""
        out: list[VoteStats | None] = []
        for rec in self._records:
            if rec["kind"] != "spend":
                continue
            if rec.get("votes") is None:
                out.append(None)
                continue
            answered = self._codec.decode(rec.get("answered"))  # None stays None
            out.append(VoteStats(votes=np.asarray(self._codec.decode(rec["votes"])),
                                 answered=None if answered is None else np.asarray(answered)))
        return out

    # -------------------------------------------------------------------------------------- budget
    def _check_budget(self, planned: Sequence[PrivacyEvent], what: str) -> None:
        if self.max_epsilon is None:
            return
        spent = self.epsilon().value
        after = epsilon(merge_events(self._events + list(planned)), delta=self.delta,
                        accounting=self.accounting, breakdown=False)
        if after.value > self.max_epsilon:
            msg = (f"{what} would bring epsilon to {after.value:.4g} ({self.accounting} accounting, "
                   f"delta={self.delta:g}), above --max-epsilon {self.max_epsilon:g}; already spent "
                   f"{spent:.4g} in {len(self._events)} recorded use(s) ({self.path})")
            if after.notes:
                msg += " [" + "; ".join(after.notes) + "]"
            raise BudgetExceededError(msg)

    def check_can_start(self, planned_events: Sequence[PrivacyEvent] | PrivacyEvent) -> EpsilonResult:
        """Refuse to start (BudgetExceededError) if the recorded events plus ``planned_events`` exceed
        max_epsilon; otherwise return the planned total under the ledger's accounting.

        ``planned_events``: what the run will still spend, i.e. on resume the events not yet recorded
        (the recorded ones are already counted)."""
        planned = as_events(planned_events)
        # described merged: twenty stages of one mechanism read as one line, not twenty
        self._check_budget(planned, "the planned run (" + "; ".join(e.describe() for e in merge_events(planned)) + ")")
        return epsilon(merge_events(self._events + planned), delta=self.delta, accounting=self.accounting,
                       breakdown=False)

    # --------------------------------------------------------------------------------------- spend
    def spend(self, key: str, event: PrivacyEvent, compute_answers: Callable[[], Any], *,
              map_location: Any = None) -> Any:
        """Answers of the mechanism use ``key``, spending budget for ``event`` only the first time.

        * ``key`` already recorded: the recorded answers are returned (tensors on CPU, or on
          ``map_location``); nothing is spent; the recorded event must equal ``event``.
        * otherwise: raise BudgetExceededError if the total would exceed max_epsilon (before anything
          is computed), call ``compute_answers()`` (returning the answers, or a :class:`LedgerAnswer`),
          append the record, flush and fsync, then return the answers.
        """
        if not isinstance(key, str) or not key:
            raise PrivacyError(f"ledger key must be a non-empty string, got {key!r}")
        if not isinstance(event, PrivacyEvent):
            raise PrivacyError(f"ledger.spend needs a privacy event, got {event!r}")
        if key in self._by_key:
            rec = self._by_key[key]
            recorded = event_from_dict(rec["event"])
            if recorded != event:
                raise RunError(f"ledger key {key!r} was recorded for {recorded.describe()} but is now requested for "
                               f"{event.describe()}: the resumed run does not match the recorded one")
            return self._codec.decode(rec["answers"], map_location)
        self._check_budget([event], f"spending {key!r} ({event.describe()})")
        result = compute_answers()
        extra = result if isinstance(result, LedgerAnswer) else LedgerAnswer(answers=result)
        self._codec.pending = []
        seq = len(self._events)
        stem = f"{seq:06d}-{_safe(key)}"
        rec: dict[str, Any] = {"kind": "spend", "seq": seq, "key": key, "event": event.to_dict(),
                               "answers": self._codec.encode(extra.answers, stem), "time": _now()}
        stats: dict[str, Any] = dict(extra.stats or {})
        if extra.votes is not None:
            conv = _to_numpy(extra.votes)
            votes = conv[0] if conv else np.asarray(extra.votes)
            stats.update(_vote_summary(votes))
            rec["votes"] = self._codec.encode(votes, stem + ".votes")
        if extra.answered is not None:
            conv = _to_numpy(extra.answered)
            answered = np.asarray(conv[0] if conv else extra.answered, dtype=bool)
            stats["answered"] = int(answered.sum())
            rec["answered"] = self._codec.encode(answered, stem + ".answered")
        if stats:
            rec["stats"] = stats
        after = both(merge_events(self._events + [event]), delta=self.delta, breakdown=False)
        if any(math.isnan(r.value) for r in after.values()):  # never recorded as null: a spend must price
            raise PrivacyError(f"the ledger's ε after {key!r} is not a number: nothing recorded")
        rec["epsilon_after"] = {name: json_num(r.value) for name, r in after.items()}
        self._append(rec)
        self._by_key[key] = rec
        self._events.append(event)
        self._commit(self._codec.pending)  # after the line: a committed side file proves its record
        return extra.answers


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def read_ledger_events(path: str | os.PathLike) -> tuple[list[PrivacyEvent], dict[str, Any] | None]:
    """Events and header of a ledger, read-only (tolerates a torn last line; no budget, no writes)."""
    view = LedgerView.read(path, missing_ok=False)
    return view.events(), view.header


class LedgerView:
    """A read-only view of what a ledger has recorded (keys and events, in order): what a method's plan needs
    to price only what is still to be spent, without creating or writing the ledger."""

    def __init__(self, spends: list[tuple[str, PrivacyEvent]], header: dict[str, Any] | None):
        self.spends, self.header = spends, header

    @classmethod
    def read(cls, path: str | os.PathLike, *, missing_ok: bool = True) -> "LedgerView":
        path = Path(path)
        if path.is_dir() or path.suffix != ".jsonl":
            path = path / LEDGER_NAME
        read = _read_ledger(path)
        if read is None:
            if missing_ok:
                return cls([], None)
            raise RunError(f"no privacy ledger at {path}")
        spends: list[tuple[str, PrivacyEvent]] = []
        header = None
        for rec, event in read.records:
            if rec["kind"] == "header":
                header = dict(rec)
            elif rec["kind"] == "config" and header is not None:
                header["max_epsilon"] = rec.get("max_epsilon")
            elif event is not None:
                spends.append((rec["key"], event))
        return cls(spends, header)

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self.spends)

    def events(self) -> list[PrivacyEvent]:
        return [event for _, event in self.spends]
