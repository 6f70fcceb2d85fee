"""Does one DGD paper-preset teacher train with the printed learning rate?

Paper CNN, Adam at LR (default 0.05, DGD Sec. IV as printed) decaying linearly over 3000 steps of batch 128,
on one 240-example partition of MNIST (60,000 / 250 teachers); prints the test accuracy on 2000 test images
at steps 300, 1000 and 3000. Usage: python experiments/teacher_lr_check.py [LR ...]
"""

import sys
import time

import torch
import torch.nn.functional as F

from privdistill.data.builtin import load_builtin
from privdistill.models.registry import create_model

STEPS, BATCH, PART = 3000, 128, 240


def to_unit(images: torch.Tensor) -> torch.Tensor:
    return images.float().div(127.5).sub(1)  # the library's [-1, 1] input range


def main(rates: list[float]) -> None:
    splits = load_builtin("mnist")
    x, y = to_unit(splits.train.images[:PART]), splits.train.labels[:PART]
    xt, yt = to_unit(splits.test.images[:2000]), splits.test.labels[:2000]
    for lr in rates:
        torch.manual_seed(0)
        model = create_model("paper-cnn", in_channels=1, num_classes=10, image_size=28)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 - t / STEPS)
        t0 = time.time()
        for step in range(STEPS):
            idx = torch.randint(0, PART, (BATCH,))
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if step + 1 in (300, 1000, STEPS):
                model.eval()
                with torch.no_grad():
                    acc = (model(xt).argmax(1) == yt).float().mean().item()
                model.train()
                print(f"lr {lr}: step {step + 1}, loss {loss.item():.3f}, test accuracy {acc:.3f} "
                      f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [0.05])
