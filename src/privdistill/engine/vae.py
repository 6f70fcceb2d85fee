"""VAE training (DGD: latent c = 32, 500 iterations, lr 1e-3 decaying linearly to 0, batch 128)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from privdistill.data.dataset import to_float
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import RunDir
from privdistill.errors import ConfigError
from privdistill.models import create_model
from privdistill.models.vae import vae_loss


@dataclass
class VAETraining:
    """Config section `vae`."""

    latent_dim: int = 32
    steps: int = 500
    batch_size: int = 128
    lr: float = 1e-3
    kl_weight: float = 1.0
    checkpoint_every: int = 200

    def validate(self) -> None:
        if min(self.latent_dim, self.steps, self.batch_size) < 1 or self.lr <= 0 or self.kl_weight < 0:
            raise ConfigError("vae latent_dim, steps, batch_size must be >= 1, lr > 0, kl_weight >= 0")


def train_vae(images: torch.Tensor, cfg: VAETraining, env: Env, *, run: RunDir | None = None) -> tuple[nn.Module, dict]:
    """Fit a conv VAE to `images` (uint8 [N, C, H, W]); resumable from `vae-checkpoint`."""
    torch.manual_seed(env.generator(streams.VAE_EPOCH, -1).initial_seed())
    vae = env.place(create_model("conv-vae", kind="vae", in_channels=images.shape[1], image_size=images.shape[2],
                                 latent_dim=cfg.latent_dim)).train()
    optimizer = torch.optim.Adam(vae.parameters(), lr=cfg.lr)
    start, elapsed = 0, 0.0
    state = run.load_checkpoint("vae-checkpoint") if run is not None else None
    if state is not None:
        vae.load_state_dict(state["vae"])
        optimizer.load_state_dict(state["optimizer"])
        start, elapsed = state["step"], state["elapsed"]
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and env.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], env.device)
    t0 = time.perf_counter()
    n = len(images)
    per_epoch = max(1, n // cfg.batch_size)
    loss = torch.tensor(0.0)
    with progress_bar(cfg.steps, "VAE", enabled=env.progress, completed=start) as bar:
        for step in range(start, cfg.steps):
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * max(0.0, 1.0 - step / cfg.steps)
            epoch, pos = divmod(step, per_epoch)
            perm = torch.randperm(n, generator=env.generator(streams.VAE_EPOCH, epoch))
            x = env.place_batch(to_float(images[perm[pos * cfg.batch_size:(pos + 1) * cfg.batch_size]]))
            # The reparameterisation noise uses the global RNG (the device's); its state is checkpointed.
            recon, mu, logvar = vae(x)
            loss = vae_loss(recon.float(), x, mu.float(), logvar.float(), beta=cfg.kl_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done = step + 1
            if run is not None and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                run.log(stage="vae", step=done, loss=float(loss.detach()))
                if done < cfg.steps:
                    run.save_checkpoint({"vae": vae.state_dict(), "optimizer": optimizer.state_dict(), "step": done,
                                         "elapsed": elapsed + time.perf_counter() - t0,
                                         "torch_rng": torch.get_rng_state(),  # randn_like draws on the device:
                                         "cuda_rng": torch.cuda.get_rng_state(env.device)
                                         if env.device.type == "cuda" else None}, "vae-checkpoint")
            bar.advance(1, loss=float(loss.detach()))
    vae.eval()
    with torch.no_grad():
        x = env.place_batch(to_float(images[:512]))
        recon, _, _ = vae(x)
        mse = float(((recon.float() - x) ** 2).mean())
    return vae, {"wall_seconds": round(elapsed + time.perf_counter() - t0, 1),
                 "final_loss": round(float(loss.detach()), 3),
                 "reconstruction_mse": round(mse, 5)}
