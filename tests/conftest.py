import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for `import fabricate`

# Tests never show progress bars and run single-threaded unless they say otherwise: reproducible timing
# and bit-identical results between a run and its resumed twin.
os.environ["PRIVDISTILL_NO_PROGRESS"] = "1"
# Never touch the user's stage cache from tests.
os.environ["PRIVDISTILL_CACHE"] = tempfile.mkdtemp(prefix="privdistill-test-cache-")
torch.set_num_threads(1)
# Under pytest-xdist (run-tests.sh runs one worker per CPU) each worker, and every command-line run it spawns,
# keeps to a core of its own: a spawned run starts one thread per core it may use (engine.device.configure_threads).
# Measured on the 2-core AMD EPYC (fp32): unpinned 9.8 min and 18 CPU-minutes, pinned 7.3 min and 12 (serial: 13).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cpus[int(_worker[2:]) % len(_cpus)]})


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("PRIVDISTILL_DATA", str(root))
    monkeypatch.delenv("PRIVDISTILL_SOURCES", raising=False)
    return root


@pytest.fixture
def tiny_npz(tmp_path):
    from fabricate import write_npz

    return write_npz(tmp_path / "tiny.npz", n=300)


@pytest.fixture
def secure_draws(monkeypatch):
    """Counts the draws made by OpenDP's samplers (privacy.secure.SecureNoise), so that a secure-mode run can be
    checked to have taken its privacy noise there and nowhere else."""
    from privdistill.privacy.secure import SecureNoise

    draws = []
    real_add, real_rr = SecureNoise.add, SecureNoise.randomized_response

    def add(self, values, **kwargs):
        draws.append(("add", values.numel()))
        return real_add(self, values, **kwargs)

    def rr(self, in_set, labels, keep):
        draws.append(("rr", len(labels)))
        return real_rr(self, in_set, labels, keep)

    monkeypatch.setattr(SecureNoise, "add", add)
    monkeypatch.setattr(SecureNoise, "randomized_response", rr)
    return draws


@pytest.fixture
def crash_student_at(monkeypatch):
    """`crash_student_at(step)`: the next student loop (engine.student_loop) raises KeyboardInterrupt when it reaches
    `step`, as a kill would, after whatever checkpoints came before; call the returned `restore()` to undo."""
    from privdistill.engine.student_loop import StudentLoop

    real = StudentLoop.update

    def arm(step: int):
        def update(self, loss, parts):
            if self.loop.step == step:
                raise KeyboardInterrupt(f"simulated crash at student step {step}")
            return real(self, loss, parts)

        monkeypatch.setattr(StudentLoop, "update", update)
        return lambda: monkeypatch.setattr(StudentLoop, "update", real)

    return arm


# The longest files first (per-file seconds on the 2-core AMD EPYC, pytest --durations=0): under run-tests.sh's
# `--dist loadfile` a worker takes the next file when it is free, so the long ones starting first leave only short
# ones for the end and the two workers finish together (alphabetically, test_srr.py's 73 s started last).
LONGEST_FIRST = ["test_srr.py", "test_dgd.py", "test_dry_run.py", "test_dpdfd.py", "test_sizing.py",
                 "test_method_behaviour.py", "test_scatternet.py", "test_distributed.py", "test_dpsgd.py",
                 "test_stages.py", "test_engine.py", "test_privacy_accounting.py"]


def pytest_collection_modifyitems(items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
