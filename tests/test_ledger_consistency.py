"""Issue 62: the ledger and the run agree, or the run stops. A spend whose answers the run used (its committed side
file, or a checkpoint written after it) is never forgotten: a cut or older ledger is refused by every reader,
and nothing is truncated. A torn last line with no such evidence (a crash while appending) stays harmless."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
import torch

from privdistill.engine.run import RunDir
from privdistill.errors import RunError
from privdistill.methods.common import RunRequest
from privdistill.privacy.events import LaplaceQueries
from privdistill.privacy.ledger import PENDING, SIDE_DIR, LedgerView, LedgerWarning, PrivacyLedger, read_ledger_events

EVENT = LaplaceQueries(40, 10)


def cut_last_line(path):
    """Cut the ledger's last record in half, as the issue's repro does; return the bytes left."""
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    lines[-2] = lines[-2][:len(lines[-2]) // 2]
    path.write_bytes(b"\n".join(lines[:-1]))
    return path.read_bytes()


def refused_by_every_reader(run_dir, match):
    """The writable ledger, the read-only view (plans) and the report all refuse; the file is left as it was."""
    before = (run_dir / "ledger.jsonl").read_bytes()
    for read in (lambda: PrivacyLedger(run_dir), lambda: LedgerView.read(run_dir),
                 lambda: read_ledger_events(run_dir)):
        with pytest.raises(RunError, match=match) as info:
            read()
        assert "restore ledger.jsonl from a backup" in str(info.value) and "\n" not in str(info.value)
    assert (run_dir / "ledger.jsonl").read_bytes() == before, "a ledger that lost a record must not be repaired"


# ------------------------------------------------------------------------------------------- the ledger
def test_a_cut_record_whose_answers_are_on_disk_is_refused_and_kept(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("a", EVENT, lambda: np.arange(10))
    led.spend("b", EVENT, lambda: np.arange(1000))  # > INLINE_LIMIT: a side file
    side = tmp_path / SIDE_DIR / "000001-b.npy"
    assert side.is_file() and not list((tmp_path / SIDE_DIR).glob("*" + PENDING))
    good = (tmp_path / "ledger.jsonl").read_bytes()
    cut_last_line(tmp_path / "ledger.jsonl")
    refused_by_every_reader(tmp_path, r"holds 1 complete spend record\(s\) and its last line is cut .*"
                                      r"ledger_answers/000001-b.npy holds the answers")
    # a record deleted whole (no torn line) is the same loss
    (tmp_path / "ledger.jsonl").write_bytes(good[:good.rstrip(b"\n").rfind(b"\n") + 1])
    refused_by_every_reader(tmp_path, "holds 1 complete spend record")
    # restored from a backup: read as before, the answers come back, nothing spent again
    (tmp_path / "ledger.jsonl").write_bytes(good)
    back = PrivacyLedger(tmp_path).spend("b", EVENT, lambda: pytest.fail("spent again"))
    assert np.array_equal(back, np.arange(1000))


def test_a_checkpoint_past_the_ledger_is_refused_even_with_inline_answers(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("stage-1", EVENT, lambda: np.arange(5))
    led.spend("stage-2", EVENT, lambda: np.arange(5))
    RunDir(tmp_path).save_checkpoint({"step": 2}, "srr-checkpoint")
    mark = torch.load(tmp_path / "srr-checkpoint.pt", weights_only=False)["ledger_mark"]
    assert mark == {"spends": 2, "last": "stage-2"}
    good = (tmp_path / "ledger.jsonl").read_bytes()
    cut_last_line(tmp_path / "ledger.jsonl")
    refused_by_every_reader(tmp_path, r"srr-checkpoint.pt was written after 2 recorded spend\(s\), the last "
                                      "'stage-2'")
    (tmp_path / "ledger.jsonl").unlink()  # a ledger deleted whole forgets everything
    with pytest.raises(RunError, match="ledger.jsonl does not exist, but srr-checkpoint.pt"):
        PrivacyLedger(tmp_path)
    with pytest.raises(RunError, match="does not exist"):
        LedgerView.read(tmp_path)
    (tmp_path / "ledger.jsonl").write_bytes(good)
    assert PrivacyLedger(tmp_path).keys() == ["stage-1", "stage-2"]
    # a checkpoint older than the ledger is the ordinary resume (labels recorded, then a crash before the checkpoint)
    RunDir(tmp_path).save_checkpoint({"step": 1}, "srr-checkpoint")
    PrivacyLedger(tmp_path).spend("stage-3", EVENT, lambda: np.arange(5))
    RunDir(tmp_path).save_checkpoint({"step": 2}, "srr-checkpoint")
    assert PrivacyLedger(tmp_path).keys() == ["stage-1", "stage-2", "stage-3"]


def test_a_crash_while_appending_stays_harmless(tmp_path, monkeypatch):
    """The side file is written pending before the line, committed after it: a crash in between leaves only
    pending answers, never returned, so the torn line is cut off and they are removed."""
    led = PrivacyLedger(tmp_path)
    led.spend("a", EVENT, lambda: np.arange(1000))
    RunDir(tmp_path).save_checkpoint({"step": 1}, "checkpoint")

    def torn_append(self, rec):
        line = json.dumps(rec, sort_keys=True).encode()
        with open(self.path, "ab") as f:
            f.write(line[:len(line) // 2])
        raise KeyboardInterrupt("killed mid-append")

    monkeypatch.setattr(PrivacyLedger, "_append", torn_append)
    with pytest.raises(KeyboardInterrupt):
        led.spend("b", EVENT, lambda: np.arange(2000))
    monkeypatch.undo()
    assert (tmp_path / SIDE_DIR / ("000001-b.npy" + PENDING)).is_file()
    with pytest.warns(LedgerWarning, match="incomplete last record"):
        assert [k for k, _ in LedgerView.read(tmp_path).spends] == ["a"]
    with pytest.warns(LedgerWarning, match="incomplete last record"):
        again = PrivacyLedger(tmp_path)
    assert again.keys() == ["a"] and (tmp_path / "ledger.jsonl").read_bytes().endswith(b"\n")
    assert sorted(p.name for p in (tmp_path / SIDE_DIR).iterdir()) == ["000000-a.npy"]
    assert np.array_equal(again.spend("b", EVENT, lambda: np.arange(7, 2007)), np.arange(7, 2007))  # drawn afresh


def test_a_crash_between_the_line_and_the_rename_keeps_the_record(tmp_path, monkeypatch):
    led = PrivacyLedger(tmp_path)
    monkeypatch.setattr(PrivacyLedger, "_commit", lambda self, pending: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        led.spend("a", EVENT, lambda: np.arange(1000))
    monkeypatch.undo()
    assert LedgerView.read(tmp_path).events() == [EVENT]  # the record is complete: its answers pending
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = PrivacyLedger(tmp_path)
    assert (tmp_path / SIDE_DIR / "000000-a.npy").is_file(), "the pending answers of a complete record are committed"
    assert np.array_equal(again.spend("a", EVENT, lambda: pytest.fail("spent again")), np.arange(1000))


# -------------------------------------------------------------------------------------------- the methods
SRR_TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
            "srr.setting=label-dp", "srr.num_samples=0", "srr.student_model=small-cnn", "srr.epochs_per_stage=1",
            "budget.accounting=paper", "budget.epsilon=2", "run.threads=1", "run.precision=fp32",
            "run.progress=false", "run.device=cpu"]


def cli(monkeypatch, capsys, *args):
    """`privdistill ARGS` in this process: (exit status, stderr)."""
    from privdistill.cli import main

    monkeypatch.setenv("PRIVDISTILL_KEEP_FREED_MEMORY", "0")
    monkeypatch.setattr(sys, "argv", ["privdistill", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("stages", [1, 2], ids=["answers-in-a-side-file", "answers-inline"])
def test_srr_run_with_its_last_record_cut_refuses_report_and_resume(tiny_npz, tmp_path, monkeypatch, capsys, stages):
    """The issue's repro: cut the last line of a finished SRR run's ledger in half. One stage of 300 labels keeps its
    answers in a side file (and the checkpoint is past the ledger); two stages of 150 keep them inline, and the
    checkpoint alone is the evidence."""
    from privdistill.methods.srr import run_srr

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    request = RunRequest(dataset=f"npz:{tiny_npz}", overrides=SRR_TINY + [f"srr.stages={stages}"],
                         run_dir=str(run_dir))
    summary = run_srr(request).summary
    assert summary["num_labels"] == 300
    backup = (run_dir / "ledger.jsonl").read_bytes()
    cut = cut_last_line(run_dir / "ledger.jsonl")
    code, err = cli(monkeypatch, capsys, "privacy", "report", run_dir)
    assert code == 2 and "Traceback" not in err and "its last line is cut" in err, err
    assert f"srr-checkpoint.pt was written after {stages} recorded spend(s)" in " ".join(err.split())
    request.resume = True
    with pytest.raises(RunError, match="the record of answers this run has used is missing"):
        run_srr(request)
    assert (run_dir / "ledger.jsonl").read_bytes() == cut, "nothing truncated"
    assert (run_dir / SIDE_DIR / "000000-stage-1.npy").is_file() == (stages == 1)
    # restored: the report and the resume read every spend again
    (run_dir / "ledger.jsonl").write_bytes(backup)
    code, err = cli(monkeypatch, capsys, "privacy", "report", run_dir, "--json")
    assert code == 0, err
    assert run_srr(request).summary["epsilon_paper"] == summary["epsilon_paper"]


DPSGD_TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
              "dpsgd.epochs=2", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "run.progress=false",
              "run.precision=fp32", "run.device=cpu", "budget.epsilon=1", "budget.accounting=paper"]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dpsgd_run_with_its_record_cut_or_lost_refuses_to_resume(tiny_npz, tmp_path):
    """DP-SGD keeps no ledger: Opacus's accountant in dpsgd-checkpoint.pt is its record. Cut in half, or deleted
    while the run's model is saved, a resume must refuse (not crash with a traceback, not train and spend again)."""
    from privdistill.methods.dpsgd import run_dpsgd

    run_dir = tmp_path / "run"
    request = RunRequest(dataset=f"npz:{tiny_npz}", overrides=DPSGD_TINY, run_dir=str(run_dir))
    run_dpsgd(request)
    checkpoint = run_dir / "dpsgd-checkpoint.pt"
    whole = checkpoint.read_bytes()
    model = (run_dir / "model.safetensors").read_bytes()
    request.resume = True
    checkpoint.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(RunError, match=r"dpsgd-checkpoint.pt cannot be read .*Opacus's accountant"):
        run_dpsgd(request)
    checkpoint.unlink()
    with pytest.raises(RunError, match="dpsgd-checkpoint.pt is missing, but the run saved its model"):
        run_dpsgd(request)
    assert (run_dir / "model.safetensors").read_bytes() == model and not checkpoint.exists(), "nothing was changed"


def test_dpsgd_refuses_epochs_logged_past_its_checkpoint_but_not_a_crash_before_one(tmp_path):
    from privdistill.methods.dpsgd import refuse_lost_record

    run = RunDir(tmp_path)
    run.log(stage="dpsgd", step=1, epoch=1)  # logged, then killed before the checkpoint: epoch 1 is redone
    refuse_lost_record(run, 0, 3)
    run.log(stage="dpsgd", step=2, epoch=2)  # two epochs logged, no checkpoint: the accountant's record is gone
    with pytest.raises(RunError, match="is missing, but the run logged 2 epoch"):
        refuse_lost_record(run, 0, 3)
    refuse_lost_record(run, 1, 3)
    refuse_lost_record(run, 3, 3)  # finished: nothing left to train


# ---------------------------------------------------------------------------------- an unwritable run directory
@pytest.mark.parametrize("failing", ["checkpoint", "ledger"])
def test_a_run_directory_that_turns_unwritable_ends_in_one_line_and_loses_nothing(tiny_npz, tmp_path, monkeypatch,
                                                                                  capsys, failing):
    """Stage 2 of an SRR run cannot write (as when its directory turns read-only mid-run: chmod does not stop root,
    so the write is made to fail): one line naming the file and the run directory, exit status 2, no traceback; the
    ledger holds exactly the spends whose answers were used, and a resume finishes the run without spending again."""
    import errno

    from privdistill.privacy.ledger import LEDGER_NAME

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    args = ["srr", "-d", f"npz:{tiny_npz}", "--run-dir", run_dir]
    for item in SRR_TINY + ["srr.stages=2"]:
        args += ["--set", item]
    real_append, real_save = PrivacyLedger._append, RunDir.save_checkpoint
    target = {"checkpoint": run_dir / "srr-checkpoint.pt", "ledger": run_dir / LEDGER_NAME}[failing]

    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    def append(self, rec):  # stage 2's record cannot be appended
        if rec.get("key") == "stage-2":
            refuse(self.path)
        return real_append(self, rec)

    def save(self, state, name="checkpoint"):  # the checkpoint after stage 1 cannot be written
        refuse(self.checkpoint_path(name))

    monkeypatch.setattr(PrivacyLedger, "_append", append) if failing == "ledger" else \
        monkeypatch.setattr(RunDir, "save_checkpoint", save)
    code, err = cli(monkeypatch, capsys, *args)
    errors = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    line = " ".join(err.split())
    assert f"cannot write {target}: Permission denied" in line
    assert f"The run directory {run_dir} is not writable" in line and "--resume" in line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consistent: nothing torn, no record missing
        assert [k for k, _ in LedgerView.read(run_dir).spends] == ["stage-1"]
    before = [r for r in PrivacyLedger(run_dir, accounting="paper").records() if r["kind"] == "spend"]
    monkeypatch.setattr(PrivacyLedger, "_append", real_append)
    monkeypatch.setattr(RunDir, "save_checkpoint", real_save)
    code, err = cli(monkeypatch, capsys, *args, "--resume")
    assert code == 0, err
    after = [r for r in PrivacyLedger(run_dir, accounting="paper").records() if r["kind"] == "spend"]
    assert after[:len(before)] == before and [r["key"] for r in after] == ["stage-1", "stage-2"]


def test_only_a_refused_write_becomes_the_one_line_message(tmp_path):
    import errno

    from privdistill.cli import unwritable_message

    assert unwritable_message(FileNotFoundError(errno.ENOENT, "No such file", str(tmp_path / "x"))) is None
    assert unwritable_message(PermissionError(errno.EACCES, "Permission denied")) is None  # no file named
    full = unwritable_message(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.npz")))
    assert full == f"cannot access {tmp_path / 'x.npz'}: No space left on device (check its permissions and the free " \
                   "space of its disk)"
