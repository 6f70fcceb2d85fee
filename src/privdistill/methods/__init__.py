"""The methods, each a thin composition of engine stages, with one Python API shape:

    from privdistill.methods import DGD, DPDFD, DPSGD, PATE, SRR
    released = DGD(epsilon=10, queries=1300).fit("mnist")      # or DPDFD(teacher=model, epsilon=10), SRR(epsilon=1),
                                                               # DPSGD(epsilon=1, recipe="scatternet"), PATE(epsilon=10)
    released.student, released.generator, released.summary["epsilon_strict"], released.privacy  # a RunResult

Loaded on first use (PEP 562), so importing one module of this package does not import every method.
"""

from importlib import import_module

_EXPORTS = {"DGD": "dgd", "DPDFD": "dpdfd", "SRR": "srr", "DPSGD": "dpsgd", "PATE": "pate", "RunResult": "runner",
            "RunRequest": "common", "Budget": "runner", "TeacherSpec": "dpdfd"}
__all__ = ["DGD", "DPDFD", "DPSGD", "PATE", "SRR", "Budget", "RunRequest", "RunResult", "TeacherSpec"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'privdistill.methods' has no attribute {name!r}")
    return getattr(import_module(f"privdistill.methods.{_EXPORTS[name]}"), name)
