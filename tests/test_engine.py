import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from cli_run import cli_in_process
from privdistill.atomic import atomic_write_bytes
from privdistill.config import ClassifierTraining
from privdistill.data import load_data
from privdistill.engine import Env, RunDir, evaluate, train_classifier
from privdistill.engine.augment import random_affine, random_flip, random_shift
from privdistill.engine.run import SUMMARY_KEYS
from privdistill.errors import ConfigError, RunError
from privdistill.models import create_model


def test_training_learns_the_fabricated_task(tiny_npz, tmp_path):
    data = load_data(f"npz:{tiny_npz}")
    model = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    env = Env.cpu(seed=0)
    before = evaluate(model, data.test, env)
    run = RunDir.open(tmp_path / "run", config={"x": 1})
    cfg = ClassifierTraining(model="small-cnn", epochs=6, batch_size=32, lr=3e-3, checkpoint_every=5)
    result = train_classifier(model, data.train, cfg=cfg, env=env, run=run, test=data.test)
    assert result.test_accuracy > 0.9 > before + 0.3
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all("test_accuracy" in record for record in lines)


def test_augmentations_are_vectorised_and_seeded():
    x = torch.randn(8, 3, 10, 10)
    a = random_shift(x, 2, torch.Generator().manual_seed(1))
    b = random_shift(x, 2, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)
    # a shift moves pixels, never invents values besides the black fill
    assert set(torch.unique(a).tolist()) <= set(torch.unique(x).tolist()) | {-1.0}
    f = random_flip(x, torch.Generator().manual_seed(0))
    flipped = [torch.equal(f[i], x[i].flip(-1)) for i in range(8)]
    assert all(flipped[i] or torch.equal(f[i], x[i]) for i in range(8)) and any(flipped)


def test_affine_augmentation_rotates_within_its_bounds_and_fills_black():
    x = torch.rand(6, 1, 28, 28) * 2 - 1
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a, b = random_affine(x, gen()), random_affine(x, gen())
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)
    assert a.min() >= -1 - 1e-6 and a.max() <= 1 + 1e-6  # bilinear resampling stays in the images' range
    # without rotation, scaling or shift it is the identity; a black image stays black (the fill is -1)
    assert torch.allclose(random_affine(x, gen(), degrees=0, scale=0, max_shift=0), x, atol=1e-5)
    assert torch.equal(random_affine(-torch.ones(2, 1, 28, 28), gen()), -torch.ones(2, 1, 28, 28))
    # a 90-degree bound can turn a vertical bar far from vertical; 10 degrees keeps it nearly so
    bar = -torch.ones(64, 1, 28, 28)
    bar[..., 4:24, 13:15] = 1.0
    spread = lambda y: ((y > 0).float().sum(-2) > 0).sum((-1, -2)).float().mean()  # noqa: E731  columns lit
    assert spread(random_affine(bar, gen(), degrees=10, scale=0, max_shift=0)) < 5
    assert spread(random_affine(bar, gen(), degrees=90, scale=0, max_shift=0)) > 10

def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    class Boom(Exception):
        pass

    from privdistill.atomic import atomic_write

    def half_write(f):
        f.write(b"new but incomplete")
        raise Boom

    with pytest.raises(Boom):
        atomic_write(target, half_write)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"], "no temporary file left behind"


def test_run_dir_refuses_to_overwrite_or_resume_with_another_config(tmp_path):
    RunDir.open(tmp_path / "r", config={"lr": 1}).log(step=1, loss=0.5)
    with pytest.raises(RunError, match="--resume"):
        RunDir.open(tmp_path / "r", config={"lr": 1})
    with pytest.raises(RunError, match="differs in lr"):
        RunDir.open(tmp_path / "r", config={"lr": 2}, resume=True)
    RunDir.open(tmp_path / "r", config={"lr": 1}, resume=True)
    with pytest.raises(RunError, match="not a run directory"):
        RunDir.existing(tmp_path / "nothing")


def test_resume_ignores_display_only_options(tmp_path):
    """Issue 64: `--resume` was refused when only the progress display differed."""
    RunDir.open(tmp_path / "r", config={"run": {"progress": True, "runs_dir": "runs", "seed": 0}, "lr": 1}).log(step=1)
    RunDir.open(tmp_path / "r", config={"run": {"progress": False, "runs_dir": "elsewhere", "seed": 0}, "lr": 1},
                resume=True)
    with pytest.raises(RunError, match=r"differs in run\.seed$"):
        RunDir.open(tmp_path / "r", config={"run": {"progress": False, "runs_dir": "runs", "seed": 1}, "lr": 1},
                    resume=True)


def test_a_run_that_stopped_before_doing_anything_does_not_block_a_corrected_retry(tmp_path):
    from privdistill.privacy.events import LaplaceQueries
    from privdistill.privacy.ledger import PrivacyLedger

    RunDir.open(tmp_path / "r", config={"teacher": "typo"})  # e.g. the teacher check failed right after
    PrivacyLedger(tmp_path / "r")  # the budget was checked (header written), nothing spent
    run = RunDir.open(tmp_path / "r", config={"teacher": "fixed"})
    assert run.config() == {"teacher": "fixed"}
    # the bench retries a failed cell with --resume: an abandoned attempt (or what is left of one, its lock file)
    # starts afresh there too, while a directory holding anything else is still refused
    RunDir.open(tmp_path / "s", config={"teacher": "typo"})
    PrivacyLedger(tmp_path / "s")
    assert RunDir.open(tmp_path / "s", config={"teacher": "fixed"}, resume=True).config() == {"teacher": "fixed"}
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / ".lock").write_text("1")
    assert RunDir.open(tmp_path / "t", config={"a": 1}, resume=True).config() == {"a": 1}
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a run directory"):
        RunDir.open(tmp_path / "u", config={"a": 1}, resume=True)
    # but a directory whose ledger records spending is never taken over
    PrivacyLedger(tmp_path / "r").spend("q", LaplaceQueries(40, 1), lambda: [0])
    with pytest.raises(RunError, match="already holds a run"):
        RunDir.open(tmp_path / "r", config={"teacher": "other"})


def test_a_run_directory_of_a_live_process_is_never_taken_over(tmp_path):
    """A run still in its first epoch has written only config.yaml: a second launch must not take it over."""
    import yaml

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RunDir.open(tmp_path / "r", config={"lr": 1})
        doc = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
        doc["pid"] = child.pid  # as if that other, live process had created it
        (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(RunError, match="already holds a run"):
            RunDir.open(tmp_path / "r", config={"lr": 2})
    finally:
        child.kill()
        child.wait()
    RunDir.open(tmp_path / "r", config={"lr": 2})  # its owner is gone: an abandoned attempt


def _cli(*args, env_extra=None):
    env = {**os.environ, "PRIVDISTILL_NO_PROGRESS": "1", **(env_extra or {})}
    return [sys.executable, "-m", "privdistill", *args], env


TRAIN_ARGS = ["--set", "baseline.model=small-cnn", "--set", "baseline.steps=40", "--set", "baseline.batch_size=32",
              "--set", "baseline.checkpoint_every=2", "--set", "baseline.eval_every_epochs=100",
              "--set", "run.threads=1", "--precision", "fp32", "--seed", "3", "--no-cache"]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(tiny_npz, tmp_path):
    """Kill a training run with SIGKILL mid-way, resume it, and compare with an uninterrupted run."""
    from safetensors.torch import load_file

    dataset = f"npz:{tiny_npz}"
    cmd, env = _cli("train", "baseline", "--dataset", dataset, "--run-dir", str(tmp_path / "full"), *TRAIN_ARGS)
    cli_in_process(cmd[3:], env)  # only the killed run needs a process of its own

    cmd, env = _cli("train", "baseline", "--dataset", dataset, "--run-dir", str(tmp_path / "killed"), *TRAIN_ARGS)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    ckpt = None
    while time.time() < deadline:  # with --no-cache the baseline stage lives in <run>/stages/baseline-<key>/
        found = list((tmp_path / "killed").glob("stages/baseline-*/checkpoint.pt"))
        if found and torch.load(found[0], weights_only=False)["step"] >= 10:
            ckpt = found[0]
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ckpt is not None, "no checkpoint appeared"
    killed_at = torch.load(ckpt, weights_only=False)["step"]
    assert 10 <= killed_at < 40, f"the run should have been killed mid-way, not at step {killed_at}"
    assert not (tmp_path / "killed" / "summary.json").exists()

    cmd, env = _cli("train", "baseline", "--dataset", dataset, "--run-dir", str(tmp_path / "killed"), "--resume",
                    *TRAIN_ARGS)
    cli_in_process(cmd[3:], env)
    full = load_file(tmp_path / "full" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "model.safetensors")
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[k], resumed[k]) for k in full), "resumed weights differ from the uninterrupted run"
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["test_accuracy"] == json.loads((tmp_path / "full" / "summary.json").read_text())["test_accuracy"]
    assert set(SUMMARY_KEYS) <= set(summary)


@pytest.mark.parametrize("name,message", [("tpu", "unknown device"), ("mps", "not supported"),
                                          ("meta", "not supported")])
def test_unsupported_devices_are_refused_before_training(name, message):
    from privdistill.engine.device import select_device

    with pytest.raises(ConfigError, match=message):
        select_device(name)
    assert select_device("cpu").type == "cpu"


def test_git_commit_outside_a_checkout_comes_from_the_environment(monkeypatch):
    # An install without .git (the offline GPU machine) records the commit its installer passed on.
    from privdistill.engine import run as run_module

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 128, "", "not a repo"))
    monkeypatch.delenv("PRIVDISTILL_GIT_COMMIT", raising=False)
    assert run_module.git_commit() is None
    monkeypatch.setenv("PRIVDISTILL_GIT_COMMIT", "abc123")
    assert run_module.git_commit() == "abc123"


_PAGE_FAULT_PROBE = """
import resource, sys, torch
from privdistill.cli.process import keep_freed_memory
print(keep_freed_memory())
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                          torch.nn.Linear(16 * 784, 10))
opt = torch.optim.Adam(net.parameters())
x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
for _ in range(5):
    step()
windows = []  # the quietest of three windows: faults the kernel adds under memory pressure come and go, the ~1500
for _ in range(3):  # a step of glibc's defaults come every window
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    windows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
print(min(windows))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_training_steps_do_not_page_fault_their_memory_back_in():
    # With glibc's defaults this loop takes ~1500 minor page faults a step (its buffers are returned to the
    # OS on free and faulted back in); with keep_freed_memory() the heap keeps them.
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "PRIVDISTILL_KEEP_FREED_MEMORY")}
    out = subprocess.run([sys.executable, "-c", _PAGE_FAULT_PROBE], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    if out[0] == "False":
        pytest.skip("not glibc")
    assert float(out[1]) < 300


def test_weight_average_warmup_follows_the_num_updates_rule():
    """With warm-up the decay after n averaged iterates is min(decay, (1 + n) / (10 + n)): early averages are not
    dominated by the first iterate, and later ones use the plain decay."""
    from privdistill.engine.optim import weight_average

    model = torch.nn.Linear(1, 1, bias=False)

    def feed(average, value: float) -> float:  # one iterate of the given weight; the average's weight after it
        with torch.no_grad():
            model.weight.fill_(value)
        average.update_parameters(model)
        return float(average.module.weight)

    average, expected = weight_average(model, 0.9), None
    for n, value in enumerate((2.0, 4.0, 8.0) + (1.0,) * 200):
        got = feed(average, value)
        if expected is None:
            expected = value  # the first update copies the iterate
        else:
            decay = min(0.9, (1 + n) / (10 + n))  # n iterates were averaged before this one
            expected = decay * expected + (1 - decay) * value
        assert math.isclose(got, expected, rel_tol=1e-5)


def test_saved_weights_are_the_same_bytes_in_every_process(tmp_path):
    """The same weights and metadata give the same file in two processes (safetensors alone orders the metadata
    by a per-process hash), so a stage keyed by a weights file's digest is found again instead of rebuilt; the
    file loads back with its tensors and metadata."""
    import subprocess
    import sys

    from safetensors import safe_open
    from safetensors.torch import load_file

    script = ("import sys, torch; from privdistill.engine.run import RunDir; "
              "m = torch.nn.Linear(3, 2); torch.nn.init.constant_(m.weight, 0.5); torch.nn.init.zeros_(m.bias); "
              "RunDir(sys.argv[1]).save_weights('model', m, metadata={'method': 'dpsgd', 'zeta': 'z', 'alpha': 'a'})")
    m = torch.nn.Linear(3, 2)  # in this process, then in another with its own string hashes
    torch.nn.init.constant_(m.weight, 0.5)
    torch.nn.init.zeros_(m.bias)
    RunDir(tmp_path / "0").save_weights("model", m, metadata={"method": "dpsgd", "zeta": "z", "alpha": "a"})
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "1")], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "1"})
    files = [(tmp_path / k / "model.safetensors").read_bytes() for k in ("0", "1")]
    assert files[0] == files[1]
    path = tmp_path / "0" / "model.safetensors"
    assert torch.equal(load_file(path)["weight"], torch.full((2, 3), 0.5))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["alpha"] == "a" and meta["method"] == "dpsgd" and meta["zeta"] == "z"
    header = json.loads(files[0][8:8 + int.from_bytes(files[0][:8], "little")])
    assert list(header["__metadata__"]) == sorted(meta), "written in sorted order"
    assert int.from_bytes(files[0][:8], "little") % 8 == 0, "the header stays 8-byte aligned"
