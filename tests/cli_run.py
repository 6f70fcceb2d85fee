"""Running the command line inside a test's own process."""


def cli_in_process(args: list[str], env: dict[str, str] | None = None):
    """`privdistill ARGS` run in this process (typer's CliRunner, ENV set for the call): what a subprocess would
    run, without a new interpreter's imports (torch and the compiler stack its optimisers load: about 8 s here).
    The kill-and-resume tests keep a subprocess only for the run they kill."""
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    result = CliRunner().invoke(get_app(), args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result
