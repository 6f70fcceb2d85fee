import json

from privdistill.bench.report import method_table, regenerate, update_block


def test_blocks_are_replaced_in_place_and_prose_kept(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\nintro\n\n<!-- dgd-quick -->\n\noutro\n")
    results = tmp_path / "results" / "quick"
    results.mkdir(parents=True)
    summary = {"method": "dgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9612, "target_epsilon": 10.0,
               "epsilon_paper": 11.9, "epsilon_strict": 9.34, "delta": 1e-5, "wall_seconds": 600,
               "command": "privdistill dgd"}
    (results / "dgd-mnist-eps10.json").write_text(json.dumps(summary))
    regenerate(tmp_path / "results", doc)
    text = doc.read_text()
    assert "intro" in text and "outro" in text
    assert "| dgd | mnist | 10 | 96.12 | 97.40 | 11.9 | 9.34 | 1e-05 | 10.0 |" in text
    regenerate(tmp_path / "results", doc)  # idempotent
    assert doc.read_text() == text
    old = tmp_path / "results" / "superseded" / "quick"  # numbers a fix made obsolete: not a preset
    old.mkdir(parents=True)
    (old / "dgd-mnist-eps10.json").write_text(json.dumps({**summary, "test_accuracy": 0.1}))
    regenerate(tmp_path / "results", doc)
    assert doc.read_text() == text and "superseded" not in text


def test_update_block_appends_when_no_marker():
    assert update_block("# T\n", "x", "body").endswith("<!-- x:start -->\nbody\n<!-- x:end -->\n")


def test_variants_are_compared_with_the_papers_variant_numbers():
    rows = [{"method": "dpdfd", "dataset": "mnist", "target_epsilon": 10.0, "test_accuracy": 0.9, "variant": v,
             "_file": f"results/quick/dpdfd-mnist-eps10-{v}.json"} for v in ("no-ie", "some-sweep")]
    text = method_table(rows, ("dpdfd",))
    assert "| dpdfd (no-ie) | mnist | 10 | 90.00 | 54.63 |" in text  # DPDFD Table 5
    assert "| dpdfd (some-sweep) | mnist | 10 | 90.00 | - |" in text  # no printed number: none shown


def test_guarantee_says_in_words_whether_the_model_is_dp_as_a_whole():
    from privdistill.privacy.report import guarantee

    dp, text = guarantee({"epsilon_strict": 0.996, "epsilon_paper": 0.58, "delta": 1e-5, "not_covered": [],
                          "relation": "replace-one: substitute one record"})
    assert dp and "differentially private as a whole" in text and "0.996" in text
    dp, text = guarantee({"epsilon_strict": 28766.7, "epsilon_paper": 1.0, "delta": 1e-5,
                          "not_covered": ["non-private teacher -> generator"], "relation": "replace-one"})
    assert not dp and text.startswith("NOT") and "non-private teacher -> generator" in text
    assert "not a guarantee" in text, "the paper's figure is named for what it is"
    dp, text = guarantee({"epsilon_strict": 1.0, "epsilon_paper": 1.0, "delta": 1e-5,
                          "not_covered": ["used directly as training inputs"], "relation": "label-DP: one label"})
    assert not dp and "label-DP only" in text and "images" in text
    assert guarantee({"epsilon_strict": None, "epsilon_paper": None})[0] is False


def test_console_calls_the_strict_epsilon_a_guarantee_only_when_it_covers_the_whole_model(capsys):
    from privdistill.cli.display import show_summary

    whole = {"method": "dpsgd", "dataset": "mnist", "test_accuracy": 0.98, "epsilon_strict": 0.996,
             "epsilon_paper": 0.58, "delta": 1e-5, "not_covered": [], "relation": "replace-one"}
    part = {**whole, "method": "dpdfd", "epsilon_strict": 1.8e8, "epsilon_paper": 10.0,
            "not_covered": ["non-private teacher -> warm-started generator"]}
    labels = {**whole, "method": "srr", "epsilon_strict": 1.0, "epsilon_paper": 1.0,
              "not_covered": ["used directly as training inputs"], "relation": "label-DP: one label"}
    shown = {}
    for name, summary in (("whole", whole), ("part", part), ("labels", labels)):
        show_summary(summary)
        shown[name] = capsys.readouterr().out
    assert "epsilon_strict (guarantee)" in shown["whole"]
    assert "(guarantee)" not in shown["part"] and "epsilon_strict (part only" in shown["part"]
    assert "(guarantee)" not in shown["labels"] and "epsilon_strict (labels only)" in shown["labels"]


def test_blocks_are_rewritten_in_the_research_log_that_holds_their_markers(tmp_path):
    doc, log = tmp_path / "results.md", tmp_path / "research-log.md"
    doc.write_text("# R\n\n<!-- bench-quick -->\n")
    log.write_text("# Log\n\nprose\n\n<!-- dgd-quick:start -->\nstale\n<!-- dgd-quick:end -->\n\nmore prose\n")
    results = tmp_path / "results" / "quick"
    results.mkdir(parents=True)
    (results / "dgd-mnist-eps10.json").write_text(json.dumps({
        "method": "dgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9612, "target_epsilon": 10.0,
        "epsilon_paper": 11.9, "epsilon_strict": 9.34, "delta": 1e-5, "wall_seconds": 600}))
    regenerate(tmp_path / "results", doc)
    text, log_text = doc.read_text(), log.read_text()
    row = "| dgd | mnist | 10 | 96.12 | 97.40 | 11.9 | 9.34 | 1e-05 | 10.0 |"
    assert row in log_text and "stale" not in log_text and "prose" in log_text and "more prose" in log_text
    assert "dgd-quick" not in text and "<!-- bench-quick:start -->" in text  # not appended to results.md as well
    regenerate(tmp_path / "results", doc)  # idempotent in both
    assert doc.read_text() == text and log.read_text() == log_text


def test_readme_table_is_generated_from_the_recorded_runs(tmp_path):
    """README's recipe table is what `bench report` writes from results/quick/ (a re-run recorded without
    regenerating it fails here), and it lands in a README that holds its markers, nowhere else."""
    from pathlib import Path

    from privdistill.bench.report import load_results, readme_table

    root = Path(__file__).resolve().parents[1]
    table = readme_table(load_results(root / "results", "quick"))
    assert f"<!-- readme-recipes:start -->\n{table.rstrip()}\n<!-- readme-recipes:end -->" in \
        (root / "README.md").read_text()
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table.splitlines()}
    assert "98.51 / 98.81 %" in rows[("DP-SGD", "default")]  # the recipe's re-run, not an older record
    assert "69.96† / 84.61† %" in rows[("SRR", "default")]  # Fashion-MNIST: both releases miss shirts
    assert "57.27† / 67.72† %" in rows[("DPDFD", "default")]  # and DPDFD's miss pullovers
    assert "89.05 / 93.27 %" in rows[("DPDFD", "default")]  # MNIST: every digit, the ones revived
    assert "(strict ε 1 / 9.34)" in rows[("DGD", "default")] and "-e 0.98 -r paper" in rows[("DGD", "paper")]
    assert "--accounting paper" in rows[("DPDFD", "default")] and "strict 422 / 896" in rows[("DPDFD", "default")]
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n<!-- readme-recipes:start -->\nold\n<!-- readme-recipes:end -->\n")
    regenerate(root / "results", tmp_path / "docs" / "results.md")
    assert "old" not in (tmp_path / "README.md").read_text()
    assert "readme-recipes" not in (tmp_path / "docs" / "results.md").read_text()


def test_each_recipe_says_in_few_words_what_its_recorded_runs_cover():
    """A recipe's `covers` starts 'the whole model' exactly when its recorded runs leave no pathway uncovered."""
    from pathlib import Path

    from privdistill.bench.report import load_results
    from privdistill.recipes import recipes

    seen = 0
    for r in load_results(Path(__file__).resolve().parents[1] / "results", "quick"):
        if r.get("recipe") is None or r.get("variant"):
            continue
        covers = recipes(r["method"].rstrip("+"))[r["recipe"]].covers
        assert covers.startswith("the whole model") == (r.get("not_covered") == []), (r["_file"], covers)
        seen += 1
    assert seen >= 25
