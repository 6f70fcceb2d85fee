"""ScatterNet features at the speed of the arithmetic (issue 62): how long the scattering transform of 70,000
images of 1 x 28 x 28 takes on `--threads` CPU threads, kymatio's implementation (the reference; timed on
`--kymatio-images` of them and scaled) against the package's (models/scatternet.py, FastScattering2D), and how far
apart their coefficients are on the images both transformed.

    .venv/bin/python experiments/scatternet_speed.py [--dataset mnist] [--threads 2] [--images 70000]
        [--kymatio-images 10000]

The images: uniform in [-1, 1] (fixed seed), or with --dataset a prepared dataset's train then test images in
model space ([-1, 1]). Batches of 1,000 images, as the feature stage reads them (engine/stages.py,
fixed_features), without gradients, the outputs dropped as they come. Timed `--repeats` times each (the machine
is shared: the least is the transform's, the others carry the neighbours' load): the J = 2 transform
(`scatter-linear`'s), the J = 1 one (the multiscale model's second scale), and `scatter-linear`'s whole fixed
features (the J = 2 transform and the per-example GroupNorm). The first call (kernel compilation when numba's cache
is cold) is timed apart. The differences: on the first `--kymatio-images` (J = 2) and 1,000 (J = 1) images. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import torch


def timed(fn, images: torch.Tensor, repeats: int = 1, batch: int = 1000) -> list[float]:
    """Seconds for fn over all images in batches, `repeats` times (the outputs dropped)."""
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(0, len(images), batch):
                fn(images[i:i + batch])
            times.append(round(time.perf_counter() - start, 2))
    return times


def outputs(fn, images: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([fn(images[i:i + batch]) for i in range(0, len(images), batch)])


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=None, help="a prepared dataset (e.g. mnist); random images without")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=70_000)
    parser.add_argument("--kymatio-images", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import kymatio
    import numba

    from privdistill.data import load_data
    from privdistill.data.dataset import to_float
    from privdistill.models import create_model
    from privdistill.models.scatternet import make_scattering

    torch.set_num_threads(args.threads)
    if args.dataset:
        data = load_data(args.dataset)
        images = to_float(torch.cat([data.train.images, data.test.images])[:args.images])
    else:
        images = torch.rand(args.images, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    size = tuple(images.shape[-2:])
    load_before = os.getloadavg()

    fast2, fast1 = make_scattering(size), make_scattering(size, J=1)
    first = time.perf_counter()
    with torch.no_grad():
        fast2(images[:8])
        fast1(images[:8])
    first = time.perf_counter() - first
    fast2_s = timed(fast2, images, args.repeats)
    fast1_s = timed(fast1, images, args.repeats)
    model = create_model("scatter-linear", in_channels=images.shape[1], num_classes=10, image_size=size)
    features_s = timed(model.scatter, images, args.repeats)

    few, check1 = images[:args.kymatio_images], images[:1000]
    kymatio2 = make_scattering(size, reference=True)
    kymatio2_s = timed(kymatio2, few, args.repeats)
    diff2 = (outputs(fast2, few) - outputs(kymatio2, few)).abs()
    diff1 = (outputs(fast1, check1) - outputs(make_scattering(size, J=1, reference=True), check1)).abs()
    scale = len(images) / len(few)
    print(json.dumps({
        "device": f"{cpu_model()}, {args.threads} threads", "torch": torch.__version__,
        "kymatio": kymatio.__version__, "numba": numba.__version__,
        "images": len(images), "source": args.dataset or "uniform [-1, 1], seed 0", "shape": list(images.shape[1:]),
        "fast_first_call_s": round(first, 2),
        "fast_J2_s": fast2_s, "fast_J1_s": fast1_s, "scatter_linear_features_s": features_s,
        "kymatio_J2_images": len(few), "kymatio_J2_s": kymatio2_s,
        "kymatio_J2_s_scaled": round(min(kymatio2_s) * scale, 1),
        "speedup_J2": round(min(kymatio2_s) * scale / min(fast2_s), 1),
        "max_abs_diff_J2": float(diff2.max()), "max_abs_diff_J1": float(diff1.max()),
        "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }))


if __name__ == "__main__":
    main()
