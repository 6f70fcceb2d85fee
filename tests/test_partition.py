import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privdistill.config import build_section
from privdistill.data import ImageDataset, missing_classes, partition_indices
from privdistill.engine.ensemble import TeacherTraining, make_partitions
from privdistill.errors import ConfigError, DataError


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), parts=st.integers(1, 50), seed=st.integers(0, 2**31))
def test_partition_is_disjoint_complete_balanced_and_deterministic(n, parts, seed):
    parts = min(parts, n)
    split = partition_indices(n, parts, seed=seed)
    assert len(split) == parts
    joined = torch.cat(split)
    assert len(joined) == n and torch.equal(joined.sort().values, torch.arange(n)), "disjoint and complete"
    sizes = [len(p) for p in split]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    again = partition_indices(n, parts, seed=seed)
    assert all(torch.equal(a, b) for a, b in zip(split, again)), "deterministic for a seed"


def test_different_seeds_give_different_partitions():
    a = partition_indices(1000, 10, seed=0)
    b = partition_indices(1000, 10, seed=1)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


def test_replacing_one_record_changes_one_teacher_only():
    """The ensemble's privacy analysis: a record's replacement (its label included) touches one partition."""
    labels = torch.arange(600) % 10
    changed = labels.clone()
    changed[123] = 7 if int(labels[123]) != 7 else 3
    train = ImageDataset(torch.zeros(600, 1, 2, 2, dtype=torch.uint8), labels, num_classes=10, name="toy")
    train_changed = ImageDataset(torch.zeros(600, 1, 2, 2, dtype=torch.uint8), changed, num_classes=10, name="toy")
    cfg = TeacherTraining(num_teachers=20, batch_size=8)
    before, after = make_partitions(train, cfg), make_partitions(train_changed, cfg)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_label_dependent_partitions_are_refused():
    with pytest.raises(ConfigError, match="teachers.stratified is retired: always False"):
        build_section(TeacherTraining, {"stratified": True}, "teachers")


def test_missing_classes_are_reported():
    labels = torch.tensor([0, 0, 1, 1])
    assert missing_classes(labels, [torch.tensor([0, 1]), torch.tensor([2, 3])], 2) == {0: [1], 1: [0]}


def test_more_parts_than_examples():
    with pytest.raises(DataError, match="more parts than examples"):
        partition_indices(5, 6, seed=0)
    with pytest.raises(DataError, match=">= 1"):
        partition_indices(5, 0, seed=0)
