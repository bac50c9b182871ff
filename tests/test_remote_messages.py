"""What a new user reads when a remote command fails (issue 28, finding 13): the CLI speaks its
own syntax (``--storage-option KEY=VALUE``), never the Python API's
(``storage_options={...}``). A real moto S3 server; the real CLI through click's runner."""

from __future__ import annotations

from click.testing import CliRunner
from s3_server import S3Server

from packer.cli.app import main
from packer.cli.util import cli_words

BUCKET = "messages"


def test_a_missing_dataset_names_the_cli_option_not_python(server: S3Server) -> None:
    url = f"s3://{BUCKET}/missing.lmdb"
    for command in (["inspect", url], ["verify", url]):
        done = CliRunner().invoke(
            main, [*command, "--storage-option", f"endpoint_url={server.endpoint}"]
        )
        assert done.exit_code == 1, done.output
        assert "storage_options" not in done.output, done.output
        assert "--storage-option endpoint_url=..." in done.output, done.output


def test_cli_words_rewrites_each_python_form() -> None:
    said = cli_words(
        "endpoint (storage_options={'endpoint_url': ...}); pass "
        "storage_options={'backend': 'fsspec', ...}; check storage_options; cache_dir= a disk"
    )
    assert said == (
        "endpoint (--storage-option endpoint_url=...); pass --storage-option backend=fsspec; "
        "check --storage-option; --cache-dir a disk"
    )
