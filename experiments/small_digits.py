"""A small dataset the presets were not written for (issue 27): MNIST shrunk to 8x8 pixels on a 0..16 scale, like
scikit-learn's digits. 1,500 training and 297 test records drawn at random (seeds 0 and 1), average-pooled from
28x28 to 8x8 and rounded to 0..16. Used by docs/research-log.md, "Data of your own".

    python experiments/small_digits.py OUT.npz        # then: privdistill dpsgd -d 'npz:OUT.npz?range=0,16' -e 1
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

from privdistill.data import load_data


def shrink(split, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    idx = torch.randperm(len(split.labels), generator=torch.Generator().manual_seed(seed))[:n]
    x = F.adaptive_avg_pool2d(split.images[idx].float(), 8)
    return np.rint(x.numpy()[:, 0] / 255 * 16).astype(np.uint8), split.labels[idx].numpy()


def main(out: str) -> None:
    data = load_data("mnist")
    x, y = shrink(data.train, 1500, 0)
    x_test, y_test = shrink(data.test, 297, 1)
    np.savez(out, x=x, y=y, x_test=x_test, y_test=y_test)
    print(f"wrote {out}: {x.shape[0]} + {x_test.shape[0]} records, 8x8, values 0..{int(x.max())}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small-digits.npz")
