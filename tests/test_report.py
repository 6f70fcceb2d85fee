import json

from privdistill.bench.report import regenerate, update_block


def test_blocks_are_replaced_in_place_and_prose_kept(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\nintro\n\n<!-- dgd-quick -->\n\noutro\n")
    results = tmp_path / "results" / "quick"
    results.mkdir(parents=True)
    summary = {"method": "dgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9612, "target_epsilon": 10.0,
               "epsilon_paper": 11.9, "epsilon_strict": 9.34, "delta": 1e-5, "wall_seconds": 600, "command": "privdistill dgd"}
    (results / "dgd-mnist-eps10.json").write_text(json.dumps(summary))
    regenerate(tmp_path / "results", doc)
    text = doc.read_text()
    assert "intro" in text and "outro" in text
    assert "| dgd | mnist | 10 | 96.12 | 97.40 | 11.9 | 9.34 | 1e-05 | 10.0 |" in text
    regenerate(tmp_path / "results", doc)  # idempotent
    assert doc.read_text() == text


def test_update_block_appends_when_no_marker():
    assert update_block("# T\n", "x", "body").endswith("<!-- x:start -->\nbody\n<!-- x:end -->\n")
