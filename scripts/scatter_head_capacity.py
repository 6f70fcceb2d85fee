"""Non-private capacity of candidate heads on the cached ScatterNet features (issue 26): how far could a private
head bigger than the linear one go, if DP-SGD cost it nothing? A reference, never a release (no clipping, no
noise; Adam 1e-3, batch 256, 6 epochs; test accuracy after every epoch).

    python scripts/scatter_head_capacity.py fashion-mnist > docs/diagnostics/scatter-head-capacity-fashion-mnist.jsonl

One JSON line per head: its parameter count (DP-SGD's noise grows with it), the curve, the best epoch, seconds.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data import load_data
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages
from privdistill.engine.trainer import accuracy
from privdistill.models import create_model
from privdistill.models.scatternet import SCATTER_ORDERS


def heads(channels: int, side: int, classes: int):
    """(name, head) pairs over [B, channels, side, side] scattering features."""
    flat = channels * side * side
    yield "linear (the packaged head)", nn.Sequential(nn.Flatten(), nn.Linear(flat, classes))
    for w in (64, 128):
        yield f"cnn{w}-relu-pool", nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * w, classes))
        yield f"cnn{w}-tanh", nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1), nn.Tanh(), nn.Conv2d(w, w, 3, stride=2, padding=1), nn.Tanh(),
            nn.Flatten(), nn.Linear(w * ((side + 1) // 2) ** 2, classes))
    yield "mlp256", nn.Sequential(nn.Flatten(), nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, classes))
    yield "conv1x1-256-linear", nn.Sequential(nn.Conv2d(channels, 256, 1), nn.ReLU(), nn.Flatten(),
                                              nn.Linear(256 * side * side, classes))


def main() -> None:
    warnings.simplefilter("ignore")
    dataset = sys.argv[1]
    data, env = load_data(dataset), Env.cpu()
    model = create_model("scatter-linear", in_channels=data.channels, num_classes=data.num_classes,
                         image_size=data.image_size[0])
    x_train, x_test = Stages(StageCache(), env, data, RunDir("/tmp/privdistill-scatter-sweep")).features(model)
    y_train, y_test = data.train.labels, data.test.labels
    for name, head in heads(SCATTER_ORDERS * data.channels, data.image_size[0] // 4, data.num_classes):
        torch.manual_seed(0)
        optimizer, started, curve = torch.optim.Adam(head.parameters(), 1e-3), time.time(), []
        for _ in range(6):
            head.train()
            for batch in torch.randperm(len(x_train)).split(256):
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(head(x_train[batch]), y_train[batch]).backward()
                optimizer.step()
            curve.append(round(accuracy(head, x_test, y_test, env), 4))
        print(json.dumps({"dataset": dataset, "head": name, "params": sum(p.numel() for p in head.parameters()),
                          "curve": curve, "best": max(curve), "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
