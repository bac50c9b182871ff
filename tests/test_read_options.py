"""Read options are keywords in the signatures (issue 29, item 2): a typo is a PackerError naming
the closest known keyword, before anything is opened; video classes show their options; URLs
work in ``open_video_dataset``; the old names warn."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from s3_server import S3Server

import packer
from packer.demo.video import make_video_tree
from packer.read.options import READ_OPTIONS
from packer.write.convert import convert_video

BUCKET = "options"


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    tree = make_video_tree(root / "videos", classes=2, per_class=2, frames=(5, 6))
    return convert_video(tree.root, root / "clips.lmdb", progress=False).dst


@pytest.mark.parametrize(
    "cls",
    [packer.LMDBDataset, packer.NPYDataset, packer.HDF5Dataset, packer.BMPDataset]
    + [packer.LMDBVideoDataset, packer.NPYVideoDataset, packer.HDF5VideoDataset]
    + [packer.BMPVideoDataset],
)
def test_every_packed_class_shows_the_read_options(cls: type) -> None:
    parameters = inspect.signature(cls).parameters
    assert set(READ_OPTIONS) <= set(parameters)
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in READ_OPTIONS)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "Video" in cls.__name__:
        assert {"transform", "output", "sampling", "num_frames", "stride", "seed"} <= set(
            parameters
        )


def test_a_typo_names_the_closest_option(packed: dict[str, Path]) -> None:
    with pytest.raises(
        packer.PackerError, match=r"no option 'readahed' \(did you mean 'readahead'"
    ):
        packer.open_dataset(packed[".lmdb"], readahed=True)
    with pytest.raises(
        packer.PackerError, match=r"open_dataset takes no option 'outptu' \(did you mean 'output'"
    ):
        packer.open_dataset(packed[".lmdb"], outptu="numpy")
    with pytest.raises(
        packer.PackerError, match=r"NPYDataset takes no option 'num_frames'; it takes: batch_buffer"
    ):
        packer.open_dataset(packed[".npy"], num_frames=4)  # a clip's option on images


def test_a_typo_in_a_video_option(clips: Path) -> None:
    with pytest.raises(packer.PackerError, match=r"'sampeling' \(did you mean 'sampling'"):
        packer.open_dataset(clips, sampeling="random")
    with pytest.raises(packer.PackerError, match=r"'sampeling' \(did you mean 'sampling'"):
        packer.open_video_dataset(clips, sampeling="random")


def test_a_read_option_a_format_does_not_take(packed: dict[str, Path]) -> None:
    with pytest.raises(
        packer.PackerError, match="BMP dataset's reader takes no option 'readahead'"
    ):
        packer.BMPDataset(packed[".bmp"], readahead=True)


def test_read_options_on_a_plain_folder_are_refused(tree: object) -> None:
    root = tree.root  # type: ignore[attr-defined]
    with pytest.raises(packer.PackerError, match="max_open_files applies to a packed dataset"):
        packer.open_dataset(root, max_open_files=4)
    dataset = packer.open_dataset(root, output="numpy")
    assert isinstance(dataset, packer.FolderDataset)


def test_read_options_reach_the_reader(packed: dict[str, Path]) -> None:
    off = packer.open_dataset(packed[".lmdb"], readahead=False)
    on = packer.LMDBDataset(packed[".lmdb"], readahead=True)
    assert (off.reader.readahead, on.reader.readahead) == (False, True)
    few = packer.open_dataset(packed[".npy"], max_open_files=3, output="bytes")
    assert few.reader.handles.capacity == 3
    assert len(few) == len(packer.open_dataset(packed[".npy"]))


def test_a_url_opens_through_open_video_dataset(clips: Path, server: S3Server) -> None:
    url = server.upload(clips, "clips.lmdb")
    remote = packer.open_video_dataset(
        url, num_frames=3, output="bytes", storage_options=server.options
    )
    local = packer.open_video_dataset(clips, num_frames=3, output="bytes")
    assert isinstance(remote, packer.LMDBVideoDataset) and len(remote) == len(local)
    assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
    with pytest.raises(packer.PackerError, match=r"'storage_option' \(did you mean"):
        packer.open_video_dataset(url, storage_option=server.options)
