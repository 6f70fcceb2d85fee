import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privdistill.data import missing_classes, partition_indices
from privdistill.errors import DataError


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), parts=st.integers(1, 50), seed=st.integers(0, 2**31), stratified=st.booleans(),
       classes=st.integers(1, 10))
def test_partition_is_disjoint_complete_balanced_and_deterministic(n, parts, seed, stratified, classes):
    parts = min(parts, n)
    labels = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))
    split = partition_indices(labels, parts, seed=seed, stratified=stratified)
    assert len(split) == parts
    joined = torch.cat(split)
    assert len(joined) == n and torch.equal(joined.sort().values, torch.arange(n)), "disjoint and complete"
    sizes = [len(p) for p in split]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    again = partition_indices(labels, parts, seed=seed, stratified=stratified)
    assert all(torch.equal(a, b) for a, b in zip(split, again)), "deterministic for a seed"


def test_different_seeds_give_different_partitions():
    labels = torch.arange(1000) % 10
    a = partition_indices(labels, 10, seed=0)
    b = partition_indices(labels, 10, seed=1)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


def test_stratified_parts_keep_the_class_mix():
    labels = torch.arange(6000) % 10
    split = partition_indices(labels, 50, seed=3, stratified=True)
    for part in split:
        counts = torch.bincount(labels[part], minlength=10)
        assert int(counts.max() - counts.min()) <= 1
    assert missing_classes(labels, split, 10) == {}


def test_missing_classes_are_reported():
    labels = torch.tensor([0, 0, 1, 1])
    assert missing_classes(labels, [torch.tensor([0, 1]), torch.tensor([2, 3])], 2) == {0: [1], 1: [0]}


def test_more_parts_than_examples():
    with pytest.raises(DataError, match="more parts than examples"):
        partition_indices(torch.zeros(5, dtype=torch.long), 6, seed=0)
    with pytest.raises(DataError, match=">= 1"):
        partition_indices(torch.zeros(5, dtype=torch.long), 0, seed=0)
