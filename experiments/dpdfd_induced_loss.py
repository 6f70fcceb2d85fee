"""Whether DPDFD gets back a class it lost: a controlled version of the runs that lost the ones (docs/research-log.md,
"DPDFD's missed class"). For the first `--until` steps the generator is steered away from `--class` (L_G's CE
aimed at the argmax of the other classes, plus `--weight` x the student's mean probability of the class), so the
student learns nothing of it; after that the run goes on as the command says: the paper's L_G, or with
`--set dpdfd.revive_classes_from=N` the absent-class targets (methods/dkd.absent_class_targets). The generator reads
only the student, so the steering spends no ε; the ledger is the command's.

    python experiments/dpdfd_induced_loss.py --class 1 --until 250 -- dpdfd -d mnist -e 10 --accounting paper \\
        --set dpdfd.max_steps=500 ... [--set dpdfd.revive_classes_from=250]

Then `python experiments/dpdfd_class_coverage.py mnist RUN_DIR` gives the released student's recall per class.
"""

from __future__ import annotations

import argparse
import sys

import torch

from privdistill import cli
from privdistill.methods import dpdfd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class", dest="lost", type=int, default=1, help="the class the generator is kept from")
    parser.add_argument("--until", type=int, default=250, help="steps the generator is kept from it")
    parser.add_argument("--weight", type=float, default=10.0, help="weight of the class's mean probability in L_G")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- privdistill's arguments")
    args = parser.parse_args()
    step = {"now": 0}
    datafree_step, generator_loss = dpdfd._datafree_step, dpdfd.generator_loss

    def counted_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, at, chunk_seed):
        step["now"] = at
        return datafree_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, at, chunk_seed)

    def steered_loss(logits, feats, **kwargs):
        if step["now"] >= args.until:
            return generator_loss(logits, feats, **kwargs)
        masked = logits.detach().float().clone()
        masked[:, args.lost] = -torch.inf
        loss, parts = generator_loss(logits, feats, **{**kwargs, "targets": masked.argmax(1)})
        away = torch.softmax(logits.float(), 1)[:, args.lost].mean()
        return loss + args.weight * away, {**parts, "induced_away": float(away.detach())}

    dpdfd._datafree_step, dpdfd.generator_loss = counted_step, steered_loss
    sys.argv = ["privdistill", *[a for a in args.command if a != "--"]]
    cli.main()


if __name__ == "__main__":
    main()
