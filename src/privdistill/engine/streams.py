"""The table of random streams: every random draw of a run comes from `Env.generator(STREAM, *counters)`.

A stream id names one purpose; with the run's seed and counters (epoch, step, stage) it fixes the draw, so a resumed
run replays the same batches without saving any RNG state. Two purposes that can meet in one run must never share
an id (their draws would be correlated); methods that never share a run (DPDFD and DP-SGD, SRR and PATE) reuse
numbers, kept as first recorded because changing one changes every result. `tests/test_streams.py` checks the rules.
"""

from __future__ import annotations

# --- engine (shared by every method) ---------------------------------------------------------------------
TRAINER_EPOCH = 1  # supervised training: the permutation of each epoch
TRAINER_AUGMENT = 2  # supervised training: augmentation of each step
TEACHER_INIT = 11  # teacher ensembles: initial weights of each teacher
TEACHER_EPOCH = 12  # teacher ensembles: each teacher's permutation of each epoch
TEACHER_AUGMENT = 13  # teacher ensembles: each teacher's augmentation and input noise of each step
GENERATOR_LATENT = 21  # data-free generator learning: latent codes of each step
SYNTHETIC = 22  # synthetic sets drawn from a trained generator
SYNTHESIS_CEILING = 23  # the ceiling student of a synthetic set's quality report
GENERATOR_ADVERSARY = 25  # data-free generator learning: initial weights of the adversarial student (DFAD)
VAE_EPOCH = 31  # VAE training: the permutation of each epoch

# --- methods ---------------------------------------------------------------------------------------------
DGD_SPLIT = 41  # queries / unlabelled split of the pool; (41, 1): the held-out public slice (DGD Fig. 7, PATE)
DGD_LABELLED = 42  # student: labelled batch of each step
DGD_UNLABELLED = 43  # student: unlabelled latent codes of each step
DGD_PERTURB = 44  # student: tangent / normal perturbation directions
DGD_INIT = 45  # student: initial weights

DPDFD_LATENT = 61  # latent codes z of each step
DPDFD_NOISE_SEED = 62  # the seed of each ledger chunk's Gaussian noise
DPDFD_SAMPLE = 63  # Alg. 3: Poisson sample of each step
DPDFD_STUDENT_INIT = 64
DPDFD_GENERATOR_INIT = 65

DPSGD_INIT = 61  # (never in a run with DPDFD)
DPSGD_SAMPLE = 62
DPSGD_NOISE = 63
DPSGD_AUGMENT = 64
DP_STATISTICS = 66  # end to end: the noise of the DP source's feature statistics (methods/end_to_end.py)

SRR_INIT = 71
SRR_LATENT = 72  # latent codes of each stage's synthetic inputs
SRR_EPOCH = 73  # student batches of each stage
SRR_FINETUNE = 75  # generator fine-tuning batches
SRR_NOISE = 76  # label noise of each stage
SRR_ORDER = 77  # label-dp: the order in which private records are labelled

PATE_QUERIES = 71  # (never in a run with SRR) which public images are queried
PATE_LABELLED = 72
PATE_UNLABELLED = 73
PATE_VAT = 74
PATE_INIT = 75

MEMBERSHIP_SPLIT = 81  # audits: members / non-members
MEMBERSHIP_ASSIGN = 82  # audits: shadow models' halves
MEMBERSHIP_SHADOW_SEED = 83
INVERSION_START = 91  # audits: model inversion's starting points
