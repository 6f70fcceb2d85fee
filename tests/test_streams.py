"""The random-stream table: no two purposes that can meet in one run share an id."""

from privdistill.engine import streams


def test_engine_streams_are_unique_and_never_reused_by_a_method():
    engine = list(streams.ENGINE.values())
    assert len(engine) == len(set(engine))
    for method, ids in streams.METHODS.items():
        values = list(ids.values())
        assert len(values) == len(set(values)), f"{method} uses one id for two purposes"
        assert not set(values) & set(engine), f"{method} reuses an engine stream"


def test_every_stream_constant_is_in_the_table():
    listed = set(streams.ENGINE) | {name for ids in streams.METHODS.values() for name in ids}
    constants = {name for name in vars(streams) if name.isupper() and isinstance(getattr(streams, name), int)}
    assert constants == listed
