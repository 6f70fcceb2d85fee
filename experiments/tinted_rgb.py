"""A third small dataset the presets were not written for (docs/results.md, "Data of your own"): five Fashion-MNIST
classes (T-shirt, trouser, sandal, sneaker, bag) shrunk to 16 x 16 and tinted with a random colour per record,
stored as a user of PIL or TensorFlow would: channels LAST (N x 16 x 16 x 3), float32 in [0, 1], imbalanced (class
shares 40 / 25 / 15 / 12 / 8 %), labels 1..5 as given (no 0). 1,400 training records (seed 0), 350 test (seed 1).

    python experiments/tinted_rgb.py /tmp/own/rgb5.npz       # then: privdistill dpsgd -d npz:/tmp/own/rgb5.npz -e 1
"""

from __future__ import annotations

import sys

import numpy as np
import torch.nn.functional as F

from privdistill.data import load_data

CLASSES, SHARES, SIDE = (0, 1, 5, 7, 8), (0.40, 0.25, 0.15, 0.12, 0.08), 16


def tinted(split, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng, labels = np.random.default_rng(seed), split.labels.numpy()
    xs, ys = [], []
    for k, (c, share) in enumerate(zip(CLASSES, SHARES)):
        idx = rng.choice(np.flatnonzero(labels == c), int(round(n * share)), replace=False)
        grey = F.adaptive_avg_pool2d(split.images[idx].float(), SIDE).numpy()[:, 0] / 255
        tint = rng.uniform(0.3, 1.0, size=(len(idx), 1, 1, 3))
        xs.append((grey[..., None] * tint).astype(np.float32))
        ys.append(np.full(len(idx), k + 1))
    x, y = np.concatenate(xs), np.concatenate(ys)
    order = rng.permutation(len(y))
    return x[order], y[order]


def main(out: str) -> None:
    data = load_data("fashion-mnist")
    x, y = tinted(data.train, 1400, 0)
    x_test, y_test = tinted(data.test, 350, 1)
    np.savez(out, x=x, y=y, x_test=x_test, y_test=y_test)
    print(f"wrote {out}: {x.shape} {x.dtype} in [{x.min():.2f}, {x.max():.2f}], class counts {np.bincount(y)[1:]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "rgb5.npz")
