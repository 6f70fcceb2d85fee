"""Small datasets the presets were not written for (docs/results.md, "Data of your own"):
- the default: MNIST shrunk to 8x8 pixels on a 0..16 scale, like scikit-learn's digits: 1,500 training and 297 test
  records drawn at random (seeds 0 and 1), average-pooled from 28x28 to 8x8 and rounded to 0..16;
- `--from fashion-mnist --side 12 --train 1200 --test 300 --seed 7 --levels 255`: Fashion-MNIST shrunk to 12x12
  uint8 (training records drawn with seed 7, test records with seed 8);
- `--from sklearn`: scikit-learn's own digits (the UCI optical digits: 1,797 scans of handwriting, 8x8, 0..16), cast
  to uint8 as a user saving space would, 1,497 training and 300 test records (a permutation with seed 3).

    python experiments/small_digits.py OUT.npz        # then: privdistill dpsgd -d 'npz:OUT.npz?range=0,16' -e 1
    python experiments/small_digits.py fashion12.npz --from fashion-mnist --side 12 --train 1200 --test 300 \
        --seed 7 --levels 255                          # then: privdistill dpsgd -d npz:fashion12.npz -e 1
    python experiments/small_digits.py skdigits.npz --from sklearn   # then: -d 'npz:skdigits.npz?range=0,16'
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from privdistill.data import load_data


def shrink(split, n: int, seed: int, side: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    idx = torch.randperm(len(split.labels), generator=torch.Generator().manual_seed(seed))[:n]
    x = F.adaptive_avg_pool2d(split.images[idx].float(), side)
    return np.rint(x.numpy()[:, 0] / 255 * levels).astype(np.uint8), split.labels[idx].numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="small-digits.npz")
    parser.add_argument("--from", dest="source", default="mnist", choices=["mnist", "fashion-mnist", "sklearn"])
    parser.add_argument("--side", type=int, default=8)
    parser.add_argument("--train", type=int, default=1500)
    parser.add_argument("--test", type=int, default=297)
    parser.add_argument("--seed", type=int, default=0, help="training records' seed; the test records use seed + 1")
    parser.add_argument("--levels", type=int, default=16, help="the largest pixel value (16: digits' 0..16 scale)")
    a = parser.parse_args()
    if a.source == "sklearn":
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.images.astype(np.uint8), digits.target.astype(np.int64)
        order = np.random.default_rng(3).permutation(len(y))
        train, test = order[:1497], order[1497:]
        np.savez(a.out, x=x[train], y=y[train], x_test=x[test], y_test=y[test])
        print(f"wrote {a.out}: {len(train)} + {len(test)} records of scikit-learn's digits, 8x8, values 0..16")
        return
    data = load_data(a.source)
    x, y = shrink(data.train, a.train, a.seed, a.side, a.levels)
    x_test, y_test = shrink(data.test, a.test, a.seed + 1, a.side, a.levels)
    np.savez(a.out, x=x, y=y, x_test=x_test, y_test=y_test)
    print(f"wrote {a.out}: {x.shape[0]} + {x_test.shape[0]} records, {a.side}x{a.side}, values 0..{int(x.max())}")


if __name__ == "__main__":
    main()
