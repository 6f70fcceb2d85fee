"""The privacy ledger: reuse recorded answers, never double-spend, refuse over budget, survive crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from privdistill.errors import BudgetExceededError, PrivacyError, RunError
from privdistill.privacy.accounting import epsilon
from privdistill.privacy.events import GaussianQueries, LaplaceQueries, NormalisedGaussian
from privdistill.privacy.ledger import LedgerAnswer, LedgerWarning, PrivacyLedger, read_ledger_events
from privdistill.privacy.mechanisms import lnmax, make_generator

DELTA = 1e-5


class Calls:
    """A compute_answers that counts its calls."""

    def __init__(self, value):
        self.value = value
        self.n = 0

    def __call__(self):
        self.n += 1
        return self.value


def spends(path):
    return [json.loads(line) for line in path.read_text().splitlines() if '"spend"' in line]


def test_spend_then_reuse_without_spending_again(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=5)
    answers = torch.arange(10)
    f = Calls(answers)
    ev = LaplaceQueries(40, 10)
    assert torch.equal(led.spend("q/0", ev, f), answers)
    spent = led.epsilon().value
    again = led.spend("q/0", ev, Calls(torch.zeros(10)))
    assert torch.equal(again, answers) and f.n == 1
    assert led.epsilon().value == spent and len(led) == 1
    reopened = PrivacyLedger(tmp_path, max_epsilon=5)
    g = Calls(None)
    assert torch.equal(reopened.spend("q/0", ev, g), answers) and g.n == 0
    assert len(spends(tmp_path / "ledger.jsonl")) == 1


def test_big_answers_go_to_a_checked_side_file(tmp_path):
    led = PrivacyLedger(tmp_path)
    big = torch.randn(60000, dtype=torch.float64)
    labels = torch.randint(0, 10, (60000,))
    led.spend("labels", LaplaceQueries(40, 60000), lambda: {"x": big, "labels": labels, "n": 3})
    rec = spends(tmp_path / "ledger.jsonl")[0]
    assert "file" in rec["answers"]["__dict__"]["x"]
    back = PrivacyLedger(tmp_path).spend("labels", LaplaceQueries(40, 60000), lambda: None)
    assert torch.equal(back["x"], big) and torch.equal(back["labels"], labels) and back["n"] == 3
    side = tmp_path / rec["answers"]["__dict__"]["x"]["file"]
    side.write_bytes(side.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(RunError, match="checksum"):
        PrivacyLedger(tmp_path).spend("labels", LaplaceQueries(40, 60000), lambda: None)


def test_exact_float_answers_and_map_location(tmp_path):
    led = PrivacyLedger(tmp_path)
    x = torch.randn(16, 10)
    led.spend("g", NormalisedGaussian(1e-3, 100, 16, 1), lambda: x)
    y = PrivacyLedger(tmp_path).spend("g", NormalisedGaussian(1e-3, 100, 16, 1), lambda: None, map_location="cpu")
    assert torch.equal(x, y) and y.dtype == torch.float32


def test_refuses_over_budget_before_computing(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=8.0, accounting="strict")
    led.spend("a", LaplaceQueries(40, 900), lambda: [1])
    f = Calls([2])
    with pytest.raises(BudgetExceededError) as info:
        led.spend("b", LaplaceQueries(40, 200), f)
    msg = str(info.value)
    assert f.n == 0
    assert "above --max-epsilon 8" in msg and "already spent" in msg and "strict" in msg
    assert len(led) == 1 and len(spends(tmp_path / "ledger.jsonl")) == 1
    # what still fits is accepted
    led.spend("c", LaplaceQueries(40, 50), lambda: [3])
    assert led.epsilon().value <= 8.0


def test_paper_accounting_budget(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=10.0, accounting="paper")
    led.spend("a", LaplaceQueries(40, 900), lambda: 0)
    with pytest.raises(BudgetExceededError, match="paper accounting"):
        led.spend("b", LaplaceQueries(40, 200), lambda: 0)


def test_check_can_start_and_remaining(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=1.0)
    with pytest.raises(BudgetExceededError, match="planned run"):
        led.check_can_start([NormalisedGaussian(1e-3, 100, 256, 1)])
    assert led.check_can_start(LaplaceQueries(40, 27)).value <= 1.0
    assert led.remaining() == pytest.approx(1.0)
    led.spend("q", LaplaceQueries(40, 10), lambda: 0)
    assert 0 < led.remaining() < 1.0
    assert PrivacyLedger(tmp_path / "other").remaining() is None


def test_failed_computation_spends_nothing(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=5)

    def boom():
        raise RuntimeError("teacher crashed")

    with pytest.raises(RuntimeError):
        led.spend("q", LaplaceQueries(40, 10), boom)
    assert len(led) == 0 and "q" not in led
    assert PrivacyLedger(tmp_path, max_epsilon=5).epsilon().value == 0.0


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("a", LaplaceQueries(40, 10), lambda: [1, 2])
    path = tmp_path / "ledger.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"kind": "spend", "key": "b", "event": {"type": "lnm')  # crash mid-append
    with pytest.warns(LedgerWarning, match="incomplete last record"):
        again = PrivacyLedger(tmp_path)
    assert again.keys() == ["a"]
    assert path.read_bytes().endswith(b"\n")
    f = Calls([9])
    assert again.spend("b", LaplaceQueries(40, 5), f) == [9] and f.n == 1  # never used: computed afresh
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    assert [r["key"] for r in spends(path)] == ["a", "b"]


def test_complete_last_record_without_newline_is_kept(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("a", LaplaceQueries(40, 10), lambda: [1])
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    again = PrivacyLedger(tmp_path)
    assert again.keys() == ["a"] and path.read_bytes().endswith(b"\n")


def test_corrupt_middle_line_is_an_error(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("a", LaplaceQueries(40, 10), lambda: 1)
    led.spend("b", LaplaceQueries(40, 10), lambda: 2)
    path = tmp_path / "ledger.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunError, match="corrupt"):
        PrivacyLedger(tmp_path)


def test_resumed_run_must_match(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("a", LaplaceQueries(40, 10), lambda: 1)
    with pytest.raises(RunError, match="does not match"):
        led.spend("a", LaplaceQueries(20, 10), lambda: 1)
    with pytest.raises(RunError, match="accounting=strict"):
        PrivacyLedger(tmp_path, accounting="paper")
    with pytest.raises(RunError, match="delta"):
        PrivacyLedger(tmp_path, delta=1e-6)


def test_max_epsilon_change_is_recorded(tmp_path):
    PrivacyLedger(tmp_path, max_epsilon=2.0).spend("a", LaplaceQueries(40, 10), lambda: 1)
    PrivacyLedger(tmp_path, max_epsilon=3.0)
    events, header = read_ledger_events(tmp_path)
    assert header["max_epsilon"] == 3.0 and len(events) == 1


def test_votes_recorded_for_data_dependent_accounting(tmp_path):
    led = PrivacyLedger(tmp_path)
    g = make_generator(0)
    votes = torch.tensor([[250, 0, 0, 0]]).repeat(300, 1)
    led.spend("q", GaussianQueries(40, 300),
              lambda: LedgerAnswer(answers=lnmax(votes, scale=1, generator=g), votes=votes))
    rec = spends(tmp_path / "ledger.jsonl")[0]
    assert rec["stats"]["unanimous"] == 300 and rec["stats"]["queries"] == 300
    assert "votes" in rec and "file" in rec["votes"]
    stats = PrivacyLedger(tmp_path).vote_stats()
    assert stats[0].votes.shape == (300, 4)
    r = PrivacyLedger(tmp_path).epsilon(data_dependent=True)
    assert r.data_dependent < r.value


def test_bad_input(tmp_path):
    with pytest.raises(PrivacyError, match="max_epsilon"):
        PrivacyLedger(tmp_path, max_epsilon=0)
    with pytest.raises(PrivacyError, match="delta"):
        PrivacyLedger(tmp_path, delta=1.0)
    led = PrivacyLedger(tmp_path)
    with pytest.raises(PrivacyError, match="key"):
        led.spend("", LaplaceQueries(40, 1), lambda: 1)
    with pytest.raises(PrivacyError, match="privacy event"):
        led.spend("k", {"type": "lnmax"}, lambda: 1)
    with pytest.raises(PrivacyError, match="JSON-able"):
        led.spend("k", LaplaceQueries(40, 1), lambda: object())


CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from privdistill.privacy.events import LaplaceQueries
    from privdistill.privacy.ledger import PrivacyLedger
    assert "torch" not in sys.modules  # the ledger itself does not need torch (fast child)
    run_dir, crash_at, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    led = PrivacyLedger(run_dir, max_epsilon=9.0)
    rng = np.random.default_rng(seed)
    votes = np.arange(40).reshape(4, 10) % 7
    def noisy_argmax():  # stands in for lnmax: answers that differ between seeds
        return np.argmax(votes + rng.laplace(scale=40, size=votes.shape), axis=1)
    out = []
    for i in range(6):
        labels = led.spend(f"batch/{i}", LaplaceQueries(40, 4), noisy_argmax)
        out.append(labels.tolist())
        if i == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)   # crash after the answer was used
    print(out)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
def test_crash_and_resume_reuses_answers_and_never_double_spends(tmp_path):
    run = tmp_path / "run"
    crashed = subprocess.run([sys.executable, "-c", CHILD, str(run), "2", "1"], capture_output=True, text=True)
    assert crashed.returncode != 0
    before = {r["key"]: r for r in spends(run / "ledger.jsonl")}
    assert sorted(before) == ["batch/0", "batch/1", "batch/2"]
    # resumed with another seed: recorded batches come back unchanged, new ones are drawn afresh
    resumed = subprocess.run([sys.executable, "-c", CHILD, str(run), "-1", "2"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    out = eval(resumed.stdout.strip())  # noqa: S307 - our own child's list of lists
    for i in range(3):
        assert out[i] == before[f"batch/{i}"]["answers"]["values"]
    recs = spends(run / "ledger.jsonl")
    assert [r["key"] for r in recs] == [f"batch/{i}" for i in range(6)]
    led = PrivacyLedger(run, max_epsilon=9.0)
    assert led.epsilon().value == pytest.approx(epsilon([LaplaceQueries(40, 24)], delta=DELTA).value)


def test_ledger_path_forms(tmp_path):
    a = PrivacyLedger(tmp_path / "run.1")  # a run directory, even with a dot in its name
    assert a.path == tmp_path / "run.1" / "ledger.jsonl"
    b = PrivacyLedger(tmp_path / "custom.jsonl")
    b.spend("x", LaplaceQueries(40, 1), lambda: np.arange(1000))
    assert (tmp_path / "custom.jsonl").exists() and (tmp_path / "ledger_answers").is_dir()


def test_an_event_cannot_under_price_itself_by_its_sensitivity():
    from privdistill.privacy.events import event_from_dict

    with pytest.raises(PrivacyError, match="below the mechanism's 2"):
        LaplaceQueries(scale=40.0, count=10, sensitivity=0.001)
    with pytest.raises(PrivacyError, match="GNMax: sensitivity"):
        GaussianQueries(sigma=40.0, count=10, sensitivity=1.0)
    # a tampered ledger line is refused the same way when it is read back
    with pytest.raises(PrivacyError, match="under-price"):
        event_from_dict({"type": "lnmax", "scale": 40.0, "count": 10, "sensitivity": 0.001})
    # declaring more than the mechanism's sensitivity only over-prices: kept
    assert LaplaceQueries(scale=40.0, count=10, sensitivity=4.0).epsilon0 == pytest.approx(0.1)


def test_a_second_process_on_a_run_directory_is_refused(tmp_path, tiny_npz):
    """Issue 28: two processes on one run would draw fresh noise for the same records and spend twice. The
    first holds the run directory's lock for the whole run; the second is refused before it writes anything."""
    from privdistill.engine.run import lock_run_dir, unlock_run_dir
    from privdistill.methods.common import RunRequest
    from privdistill.methods.pate import run_pate

    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from privdistill.engine.run import lock_run_dir
        lock_run_dir({str(run_dir)!r}); print("locked", flush=True); time.sleep(60)""")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunError, match=rf"in use by another process \(pid {holder.pid}\)"):
            run_pate(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(run_dir),
                                overrides=["run.progress=false", "budget.epsilon=5"]))
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "ledger.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(run_dir)  # free again once the holder is gone; this process may take it twice
    lock_run_dir(run_dir)
    unlock_run_dir(run_dir)


def test_a_key_recorded_twice_is_refused_by_every_reader(tmp_path):
    """Issue 28: two writers (or an edit) can leave one key twice; neither the ledger nor a read-only view
    (privacy report, plans) may then trust it."""
    led = PrivacyLedger(tmp_path, max_epsilon=5)
    led.spend("q/0", LaplaceQueries(40, 10), Calls(torch.arange(10)))
    path = tmp_path / "ledger.jsonl"
    spend_line = next(line for line in path.read_text().splitlines() if '"spend"' in line)
    path.write_text(path.read_text() + spend_line + "\n")
    with pytest.raises(RunError, match="recorded twice"):
        read_ledger_events(tmp_path)
    with pytest.raises(RunError, match="recorded twice"):
        PrivacyLedger(tmp_path, max_epsilon=5)
