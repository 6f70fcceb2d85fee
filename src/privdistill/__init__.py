"""privdistill: differentially private data-free distillation (DGD, DPDFD, SRR).

Layout, in the order data flows:
    data     -> datasets, offline sources, partitions
    models   -> classifiers, generators, VAE, by name from a registry
    engine   -> device/precision, run directories, checkpoints, training loops,
                data-free generator learning, teacher ensembles, stage cache
    privacy  -> mechanisms, accounting (paper and strict), ledger, reports
    methods  -> DGD, DPDFD, SRR and the baselines, each a thin composition of engine stages
    audits   -> membership inference, model inversion
    bench    -> the reproduction matrix
    release  -> export a finished run (weights, model card) and load it back: privdistill.load(path)
    cli      -> the `privdistill` command
"""

import os as _os

__version__ = "0.1.0"

# libgomp's threads spin ~300,000 times before sleeping, which crawls where another process holds a core (research
# log, "Notes that left the code: __init__.py"). Read when torch loads libgomp; a wait policy of the user's is kept.
if "GOMP_SPINCOUNT" not in _os.environ and "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "10000"


def load(path, *, device="cpu"):
    """Load an exported release (`privdistill export`): a ``Release`` with ``.model`` (a plain torch.nn.Module),
    ``.preprocess``, ``.predict``, ``.classes`` and ``.card``. See privdistill.release."""
    # imported on use: release imports torch (and this package, for __version__), which `import privdistill`
    # and the command line's start do without
    from privdistill.release import load as _load

    return _load(path, device=device)
