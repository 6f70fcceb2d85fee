"""VAE training (DGD: latent c = 32, 500 iterations, lr 1e-3 decaying linearly to 0, batch 128)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from privdistill.data.dataset import to_float
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.optim import make_optimizer, make_schedule
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
    checkpoint_every: int = 200

    def validate(self) -> None:
        if min(self.latent_dim, self.steps, self.batch_size) < 1 or self.lr <= 0:
            raise ConfigError("vae latent_dim, steps, batch_size must be >= 1, lr > 0")


def train_vae(images: torch.Tensor, cfg: VAETraining, env: Env, *, run: RunDir | None = None) -> tuple[nn.Module, dict]:
    """Fit a conv VAE to `images` (uint8 [N, C, H, W]); resumable from `vae-checkpoint`."""
    torch.manual_seed(env.generator(streams.VAE_EPOCH, -1).initial_seed())
    vae = env.place(create_model("conv-vae", kind="vae", in_channels=images.shape[1], image_size=images.shape[2],
                                 latent_dim=cfg.latent_dim)).train()
    optimizer = make_optimizer(vae.parameters(), "adam", lr=cfg.lr)
    # save_rng: the reparameterisation noise draws from the global RNG (the device's), so its state is
    # checkpointed; the log keeps the loss of the logged step itself (mean_parts=False), as it always has
    loop = TrainingLoop(steps=cfg.steps, env=env, run=run, checkpoint="vae-checkpoint", title="VAE", log_stage="vae",
                        modules={"vae": vae}, optimizers={"vae": optimizer},
                        schedules={"vae": make_schedule(optimizer, "linear", cfg.steps)},
                        eval_every=cfg.checkpoint_every, checkpoint_every=cfg.checkpoint_every, save_rng=True,
                        mean_parts=False)
    n = len(images)
    per_epoch = max(1, n // cfg.batch_size)
    loss = torch.tensor(0.0)
    for step in loop:
        epoch, pos = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=env.generator(streams.VAE_EPOCH, epoch))
        x = env.place_batch(to_float(images[perm[pos * cfg.batch_size:(pos + 1) * cfg.batch_size]]))
        recon, mu, logvar = vae(x)
        loss = vae_loss(recon.float(), x, mu.float(), logvar.float())
        loop.update(loss)
    result = loop.finish()
    vae.eval()
    with torch.no_grad():
        x = env.place_batch(to_float(images[:512]))
        recon, _, _ = vae(x)
        mse = float(((recon.float() - x) ** 2).mean())
    return vae, {"wall_seconds": round(result.wall_seconds, 1), "final_loss": round(float(loss.detach()), 3),
                 "reconstruction_mse": round(mse, 5)}
