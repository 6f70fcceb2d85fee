"""The random-stream table (engine/streams.py): no two purposes that can meet in one run share an id."""

from privdistill.engine import streams

ENGINE = ("TRAINER_", "TEACHER_", "GENERATOR_", "SYNTHETIC", "SYNTHESIS_", "VAE_")
# The constants each method's runs draw from, by name. PATE shares DGD's held-out split on purpose (one teacher
# ensemble serves both, DGD Fig. 7).
METHODS = {
    "dgd": ("DGD_",),
    "dpdfd": ("DPDFD_",),
    "dpsgd": ("DPSGD_",),
    "srr": ("SRR_", "DP_STATISTICS"),
    "pate": ("PATE_", "DGD_SPLIT"),
    "audits": ("MEMBERSHIP_", "INVERSION_"),
}
CONSTANTS = {name: value for name, value in vars(streams).items() if name.isupper() and isinstance(value, int)}


def _group(prefixes: tuple[str, ...]) -> dict[str, int]:
    return {name: value for name, value in CONSTANTS.items() if name.startswith(prefixes)}


def test_engine_streams_are_unique_and_never_reused_by_a_method():
    engine = list(_group(ENGINE).values())
    assert len(engine) == len(set(engine))
    for method, prefixes in METHODS.items():
        values = list(_group(prefixes).values())
        assert values, f"no stream of {method}"
        assert len(values) == len(set(values)), f"{method} uses one id for two purposes"
        assert not set(values) & set(engine), f"{method} reuses an engine stream"


def test_every_stream_constant_belongs_to_the_engine_or_a_method():
    listed = set(_group(ENGINE)).union(*(_group(prefixes) for prefixes in METHODS.values()))
    assert set(CONSTANTS) == listed
