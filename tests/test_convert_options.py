"""A conversion's options are one typed object (issue 43 item 1): built once, by the CLI or by
``convert()``'s keywords, equal for the same command; a wrong type or an unknown name is refused
as it is built, by name; a plan from the object converts to the same bytes as from keywords."""

from __future__ import annotations

import dataclasses
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.cli.convert_options import convert_options
from packer.demo.image import DemoTree
from packer.errors import PackerError
from packer.write.options import ConvertOptions, FieldOptions, Limits, Resize
from packer.write.plan import plan_conversion


def test_an_unknown_option_is_refused_with_its_closest_name(tree: DemoTree, tmp_path: Path) -> None:
    with pytest.raises(PackerError) as caught:
        packer.convert(tree.root, tmp_path / "x.lmdb", shard_sise="1MiB", progress=False)
    message = str(caught.value)
    assert "'shard_sise'" in message and "'1MiB'" in message
    assert "did you mean 'shard_size'?" in message
    assert list(tmp_path.iterdir()) == []  # refused before any work
    with pytest.raises(PackerError, match="'max_pixel' .*did you mean 'max_pixels'"):
        Limits(max_pixel=10)
    with pytest.raises(PackerError, match="unknown option 'colour'.* it takes format, shard_size"):
        ConvertOptions(colour="red")


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"workers": "2"}, "option 'workers' is '2' (str); expected an int or None"),
        ({"max_side": "256"}, "option 'max_side' is '256' (str); expected an int or None"),
        ({"strict": "yes"}, "option 'strict' is 'yes' (str); expected True or False"),
        ({"max_pixels": 1.5}, "option 'max_pixels' is 1.5 (float); expected an int"),
        ({"require": 5}, "option 'require' is 5 (int); expected a list of str"),
        (
            {"part": (0, "4")},
            "option 'part' is (0, '4') (tuple); expected a pair (int, int) or None",
        ),
        (
            {"limits": {"max_pixels": 5}},
            "option 'limits' is {'max_pixels': 5} (dict); expected a Limits",
        ),
        ({"shard_size": True}, "option 'shard_size' is True (bool); expected an int"),
    ],
)
def test_a_mistyped_option_is_refused_by_name(
    tree: DemoTree, tmp_path: Path, keywords: dict, message: str
) -> None:
    with pytest.raises(PackerError) as caught:
        packer.convert(tree.root, tmp_path / "x.lmdb", progress=False, **keywords)
    assert str(caught.value) == message
    with pytest.raises(PackerError) as caught:
        ConvertOptions(**keywords)
    assert str(caught.value) == message
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_an_unknown_or_mistyped_flag_by_name(
    tree: DemoTree, tmp_path: Path
) -> None:
    dst = str(tmp_path / "x.lmdb")
    result = CliRunner().invoke(main, ["convert", str(tree.root), dst, "--shard-sise", "1MiB"])
    assert result.exit_code == 2
    assert "--shard-sise" in result.output and "--shard-size" in result.output
    result = CliRunner().invoke(main, ["convert", str(tree.root), dst, "--workers", "two"])
    assert result.exit_code == 2 and "--workers" in result.output and "'two'" in result.output
    result = CliRunner().invoke(main, ["convert", str(tree.root), dst, "--shard-size", "ten"])
    assert result.exit_code != 0 and "invalid size 'ten'" in result.output
    assert list(tmp_path.iterdir()) == []


def test_the_cli_and_the_api_build_equal_options(tree: DemoTree, tmp_path: Path) -> None:
    notes = tmp_path / "captions.json"
    notes.write_text("{}")
    args = [str(tree.root), str(tmp_path / "x.npy"), "--shard-size", "1MiB", "--workers", "2"]
    args += ["--check", "fast", "--max-side", "32", "--quality", "80", "--reencode", "--strict"]
    args += ["--max-file-size", "10MB", "--max-pixels", "1000", "--require", "txt"]
    args += ["--require", "json", "--annotations", str(notes), "--follow-links", "--part", "1/4"]
    args += ["--split", "train", "--quiet"]
    ctx = main.commands["convert"].make_context("convert", list(args))  # it consumes the list
    built = convert_options(ctx.params)
    api = ConvertOptions(
        shard_size="1MiB",
        workers=2,
        check="fast",
        max_side=32,
        quality=80,
        reencode=True,
        strict=True,
        max_file_size="10MB",
        max_pixels=1000,
        require="txt,json",
        annotations=[notes],
        follow_links=True,
        part=(1, 4),
        split="train",
        progress=False,
    )
    assert built == api
    assert built.resize == Resize(quality=80, max_side=32, reencode=True)
    assert built.fields == FieldOptions(("txt", "json"), None, (str(notes),), True)
    assert built.limits == Limits(10_000_000, 1000)
    assert ConvertOptions(**built.keywords()) == built  # what a URL conversion passes on
    ctx = main.commands["convert"].make_context("convert", list(args[:2]))
    assert convert_options(ctx.params) == ConvertOptions()  # the flags' defaults are the API's


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != "packer.json"
    }


def test_a_plan_from_options_converts_to_the_same_bytes(tree: DemoTree, tmp_path: Path) -> None:
    keywords = {"shard_size": "64KiB", "workers": 1, "check": "fast", "max_side": 32}
    options = ConvertOptions(
        shard_size=1 << 16, workers=1, check="fast", resize=Resize(max_side=32), progress=False
    )
    by_keywords = plan_conversion(tree.root, tmp_path / "a.lmdb", progress=False, **keywords)
    assert plan_conversion(tree.root, tmp_path / "a.lmdb", options=options) == by_keywords
    one = packer.convert(tree.root, tmp_path / "a.lmdb", progress=False, **keywords)
    two = packer.convert(tree.root, tmp_path / "b.lmdb", options=options)
    cli = CliRunner().invoke(
        main,
        ["convert", str(tree.root), str(tmp_path / "c.lmdb"), "--shard-size", "64KiB"]
        + ["--workers", "1", "--check", "fast", "--max-side", "32", "--quiet"],
    )
    assert cli.exit_code == 0, cli.output
    assert one.manifest.options == two.manifest.options
    assert one.manifest.options["resize"]["max_side"] == 32
    assert _files(tmp_path / "a.lmdb") == _files(tmp_path / "b.lmdb") == _files(tmp_path / "c.lmdb")
    assert len(_files(tmp_path / "a.lmdb")) > 2


def test_keywords_replace_the_options_and_the_object_is_frozen_and_picklable(
    tmp_path: Path,
) -> None:
    options = ConvertOptions(workers=4, max_side=64)
    with ThreadPoolExecutor(1) as pool:
        given = dataclasses.replace(options, workers=1, short_side=None, executor=pool)
        again = pickle.loads(pickle.dumps(given))
    assert (given.workers, given.resize.max_side, options.workers) == (1, 64, 4)
    assert again == given and given.executor is pool and again.executor is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 2  # type: ignore[misc]
    with pytest.raises(PackerError, match="exclusive"):  # the part's own rule, at construction
        ConvertOptions(max_side=64, short_side=32)
    assert packer.ConvertOptions is ConvertOptions
