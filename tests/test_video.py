"""Video conversion and clip datasets: round trips, sampling, workers, video files, bad input."""

from __future__ import annotations

import builtins
import functools
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import ConcatDataset, DataLoader

from packer.core.manifest import RECORDS_NAME, load_index, load_keys, load_manifest
from packer.decode.outputs import decode
from packer.demo.video import VideoTree, make_video_files, make_video_tree, run_video_demo
from packer.errors import DestinationError, InputFileError, PackerError
from packer.formats.files import OpenFile
from packer.read.describe_video import describe_video
from packer.read.open import open_video_dataset
from packer.read.video_datasets import (
    FolderVideoDataset,
    HDF5VideoDataset,
    NPYVideoDataset,
)
from packer.write.convert import convert_video

SUFFIXES = (".bmp", ".h5", ".lmdb", ".npy")
ENCODED = (".h5", ".lmdb", ".npy")


@pytest.fixture(scope="module")
def frames_tree(tmp_path_factory: pytest.TempPathFactory) -> VideoTree:
    """2 classes × 2 videos of 5..12 64×48 frames, one video with a truncated frame, one empty."""
    return make_video_tree(tmp_path_factory.mktemp("vsrc") / "frames", bad=1, empty=1)


@pytest.fixture(scope="module")
def packed(frames_tree: VideoTree, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("vpacked")
    result = {}
    for suffix in SUFFIXES:
        dst = out / f"frames{suffix}"
        convert_video(frames_tree.root, dst, shard_size="40kB", workers=1, progress=False)
        result[suffix] = dst
    return result


def source_frames(tree: VideoTree) -> dict[str, list[Path]]:
    """key -> frame files in natural order, for the good videos."""
    return {
        f"{folder.parent.name}/{folder.name}": sorted(
            folder.iterdir(), key=lambda p: int(p.stem.split("_")[1])
        )
        for folder in tree.videos
    }


def expected_pairs(tree: VideoTree) -> Counter:
    return Counter((key, tree.classes.index(key.split("/")[0])) for key in source_frames(tree))


@pytest.mark.parametrize("suffix", ENCODED)
def test_frames_round_trip_byte_exact(frames_tree: VideoTree, packed: dict, suffix: str) -> None:
    sources = source_frames(frames_tree)
    dataset = open_video_dataset(packed[suffix], output="bytes")
    assert sorted(dataset.keys) == sorted(sources)
    for i, key in enumerate(dataset.keys):
        files = sources[key]
        every = dataset.read_frames(i, np.arange(len(files)))
        assert every == [p.read_bytes() for p in files]
        some = np.array([0, len(files) // 2, len(files) - 1])
        assert dataset.read_frames(i, some) == [files[j].read_bytes() for j in some]


def test_bmp_pixel_exact(frames_tree: VideoTree, packed: dict) -> None:
    sources = source_frames(frames_tree)
    dataset = open_video_dataset(packed[".bmp"], num_frames=16, output="numpy")
    for i, key in enumerate(dataset.keys):
        clip, _ = dataset[i]
        wanted = dataset.clip_indices(i)
        expected = np.stack([decode(sources[key][j].read_bytes(), "numpy") for j in wanted])
        np.testing.assert_array_equal(clip, expected)


def test_manifest_index_and_skipped(frames_tree: VideoTree, packed: dict) -> None:
    for root in packed.values():
        manifest = load_manifest(root)
        index = load_index(root, manifest)
        assert manifest.kind == "video" and manifest.num_samples == len(frames_tree.videos)
        assert RECORDS_NAME in manifest.files
        assert load_keys(root) == sorted(source_frames(frames_tree))
        assert sorted(index["count"].tolist()) == sorted(frames_tree.videos.values())
        assert (
            index["first"].tolist()
            == np.concatenate(([0], np.cumsum(index["count"])[:-1])).tolist()
        )
        reasons = {Path(s["path"]).name: s["reason"] for s in manifest.skipped}
        assert reasons["empty_000"] == "video folder has no frames"
        assert "truncated JPEG" in reasons["video_002"]
        storage = manifest.options["storage"]
        assert storage["frames"] == sum(frames_tree.videos.values())
        assert storage["padding_overhead"] >= 1.0
    assert len(load_manifest(packed[".lmdb"]).shards) > 1  # 40 kB shards roll at video boundaries
    text = describe_video(packed[".npy"])
    assert "padding overhead" in text and f"videos: {len(frames_tree.videos)}" in text


def test_output_identical_for_any_worker_count(frames_tree: VideoTree, tmp_path: Path) -> None:
    for suffix, workers in ((".h5", 3), (".lmdb", 3), (".bmp", 2)):  # threads; BMP: processes
        one = convert_video(frames_tree.root, tmp_path / f"a{suffix}", workers=1, progress=False)
        many = convert_video(
            frames_tree.root, tmp_path / f"b{suffix}", workers=workers, progress=False
        )
        files = sorted(p.relative_to(one.dst) for p in one.dst.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(many.dst) for p in many.dst.rglob("*") if p.is_file())
        for name in files:
            if name.name != "packer.json":
                assert (one.dst / name).read_bytes() == (many.dst / name).read_bytes(), name


def test_outputs_sampling_and_transform(packed: dict) -> None:
    root = packed[".npy"]
    shapes = {
        "pil": lambda c: (len(c), c[0].size),
        "numpy": lambda c: c.shape,
        "tensor": lambda c: tuple(c.shape),
        "bytes": lambda c: (len(c), type(c[0])),
    }
    expected = {
        "pil": (4, (64, 48)),
        "numpy": (4, 48, 64, 3),
        "tensor": (4, 3, 48, 64),
        "bytes": (4, bytes),
    }
    for output, shape in shapes.items():
        clip, label = NPYVideoDataset(root, num_frames=4, output=output)[0]
        assert shape(clip) == expected[output] and label == 0
    seen: list[Any] = []
    dataset = NPYVideoDataset(root, num_frames=3, output="numpy", transform=seen.append)
    dataset[1]
    assert seen[0].shape == (3, 48, 64, 3)  # the transform gets the whole clip


def test_seeded_sampling_per_epoch(packed: dict) -> None:
    a = NPYVideoDataset(packed[".npy"], num_frames=3, sampling="segments", seed=5, output="bytes")
    b = NPYVideoDataset(packed[".npy"], num_frames=3, sampling="segments", seed=5, output="bytes")
    picks = {epoch: [] for epoch in range(4)}
    for epoch in picks:
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for i in range(len(a)):
            assert a.clip_indices(i).tolist() == b.clip_indices(i).tolist()
            assert a[i] == b[i]
            picks[epoch].append(a.clip_indices(i).tolist())
    assert len({str(p) for p in picks.values()}) > 1  # epochs differ
    window = NPYVideoDataset(packed[".npy"], num_frames=3, sampling="random", stride=2, seed=1)
    for i in range(len(window)):
        assert np.diff(window.clip_indices(i)).tolist() == [2, 2]


def test_short_video_padded_by_repeating_frames(packed: dict) -> None:
    dataset = open_video_dataset(packed[".lmdb"], num_frames=32, output="bytes")
    for i in range(len(dataset)):
        clip, _ = dataset[i]
        wanted = dataset.clip_indices(i)
        assert len(clip) == 32 and len(set(clip)) == dataset.frame_counts[i]
        assert sorted(set(wanted.tolist())) == list(range(dataset.frame_counts[i]))


def test_handles_lazy_per_process_and_dropped_on_pickle(packed: dict) -> None:
    for suffix in SUFFIXES:
        dataset = open_video_dataset(packed[suffix], num_frames=2, output="bytes")
        assert len(dataset.reader.handles) == 0
        first = dataset[0]
        if suffix != ".bmp":
            assert len(dataset.reader.handles) > 0
        clone = pickle.loads(pickle.dumps(dataset))
        assert len(clone.reader.handles) == 0
        assert clone[0] == first
    npy = NPYVideoDataset(packed[".npy"], output="bytes")
    npy[0]
    opened = list(npy.reader.handles.values())  # descriptors read with pread, not maps
    assert opened and all(isinstance(h, OpenFile) for h in opened)
    h5 = HDF5VideoDataset(packed[".h5"], max_open_files=2, output="bytes")
    for i in range(len(h5)):
        h5[i]
    assert len(h5.reader.handles) == 2


def list_collate(batch: list) -> list:
    return batch


def tag(suffix: str, label: int) -> tuple[str, int]:
    return suffix, label


@pytest.mark.parametrize(("context", "persistent"), [("fork", False), ("forkserver", True)])
def test_dataloader_workers_every_format(
    frames_tree: VideoTree, packed: dict, context: str, persistent: bool
) -> None:
    """One loader over all four formats; each clip is mapped back to its (format, key)."""
    datasets = [
        open_video_dataset(
            packed[s], num_frames=4, output="bytes", target_transform=functools.partial(tag, s)
        )
        for s in SUFFIXES
    ]
    clip_to_key = {}
    for dataset in datasets:  # the parent reads first (opens its handles)
        for i in range(len(dataset)):
            clip, (suffix, _) = dataset[i]
            clip_to_key[suffix, tuple(clip)] = dataset.keys[i]
    loader = DataLoader(
        ConcatDataset(datasets),
        batch_size=3,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=persistent,
        collate_fn=list_collate,
    )
    for _ in range(2 if persistent else 1):
        seen = Counter(
            (suffix, clip_to_key[suffix, tuple(clip)], label)
            for batch in loader
            for clip, (suffix, label) in batch
        )
        want = Counter(
            (s, key, label) for s in SUFFIXES for key, label in expected_pairs(frames_tree)
        )
        assert seen == want


def test_folder_dataset_matches_packed(frames_tree: VideoTree, packed: dict) -> None:
    folder = FolderVideoDataset(frames_tree.root, num_frames=4, output="bytes")
    npy = open_video_dataset(packed[".npy"], num_frames=4, output="bytes")
    by_key = {folder.keys[i]: folder[i][0] for i in range(len(folder))}
    common = [i for i in range(len(npy)) if npy.keys[i] in by_key]
    assert len(common) == len(npy)  # every packed video is also readable from the folder
    for i in common:
        assert npy[i][0] == by_key[npy.keys[i]]


@pytest.fixture(scope="module")
def files_tree(tmp_path_factory: pytest.TempPathFactory) -> VideoTree:
    """2 classes × 2 mp4 files of 5..12 frames written with PyAV, plus one garbage .mp4."""
    return make_video_files(tmp_path_factory.mktemp("vfiles") / "mp4", bad=1)


def test_mp4_converts_to_right_frame_count(files_tree: VideoTree, tmp_path: Path) -> None:
    result = convert_video(files_tree.root, tmp_path / "v.npy", progress=False, workers=2)
    dataset = open_video_dataset(result.dst, num_frames=4, output="numpy")
    counts = {f"{p.parent.name}/{p.stem}": n for p, n in files_tree.videos.items()}
    assert dict(zip(dataset.keys, dataset.frame_counts.tolist())) == counts
    assert dataset[0][0].shape == (4, 48, 64, 3)
    assert [Path(s["path"]).name for s in result.manifest.skipped] == ["broken_000.mp4"]
    assert "PyAV cannot decode" in result.manifest.skipped[0]["reason"]


def test_mp4_workers_after_pyav_ran_here_start_from_a_forkserver(
    files_tree: VideoTree, tmp_path: Path
) -> None:
    """A process that ran PyAV (FFmpeg) forks no decoding worker: one forked while an FFmpeg
    thread held a lock hung in its first decode (seen twice in the suite). Its workers come from
    a forkserver and give the same bytes as one worker."""
    import av

    from packer.write import loading

    with av.open(str(next(iter(files_tree.videos)))) as container:  # FFmpeg runs here
        next(container.decode(video=0))
    pool = loading._executor(2, cpu_bound=True)
    try:
        assert pool._mp_context.get_start_method() == "forkserver"  # type: ignore[attr-defined]
    finally:
        pool.shutdown()
    two = convert_video(files_tree.root, tmp_path / "two.npy", progress=False, workers=2)
    one = convert_video(files_tree.root, tmp_path / "one.npy", progress=False, workers=1)
    a, b = open_video_dataset(two.dst, output="bytes"), open_video_dataset(one.dst, output="bytes")
    assert [a.read_frames(i, range(a.frame_counts[i])) for i in range(len(a))] == [
        b.read_frames(i, range(b.frame_counts[i])) for i in range(len(b))
    ]


def test_mp4_resize_and_fps(files_tree: VideoTree, tmp_path: Path) -> None:
    small = convert_video(files_tree.root, tmp_path / "s.h5", max_side=32, fps=12.5, progress=False)
    dataset = open_video_dataset(small.dst, num_frames=2, output="numpy")
    assert dataset[0][0].shape == (2, 24, 32, 3)
    counts = {f"{p.parent.name}/{p.stem}": (n + 1) // 2 for p, n in files_tree.videos.items()}
    assert dict(zip(dataset.keys, dataset.frame_counts.tolist())) == counts  # every other frame
    small = convert_video(files_tree.root, tmp_path / "b.lmdb", short_side=24, progress=False)
    assert open_video_dataset(small.dst, output="numpy")[0][0].shape[1:] == (24, 32, 3)
    same = convert_video(files_tree.root, tmp_path / "c.lmdb", short_side=96, progress=False)
    assert open_video_dataset(same.dst, output="numpy")[0][0].shape[1:] == (
        48,
        64,
        3,
    )  # never enlarged


@pytest.mark.parametrize("suffix", [".mkv", ".webm", ".avi"])
def test_other_containers(tmp_path: Path, suffix: str) -> None:
    tree = make_video_files(tmp_path / "src", classes=1, per_class=1, frames=(6, 6), suffix=suffix)
    result = convert_video(tree.root, tmp_path / "out.npy", progress=False, workers=1)
    assert load_index(result.dst, result.manifest)["count"].tolist() == [6]


def test_bad_frames_strict_and_skip(frames_tree: VideoTree, tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="--strict"):
        convert_video(frames_tree.root, tmp_path / "s.npy", strict=True, progress=False)
    assert not (tmp_path / "s.npy").exists()
    result = convert_video(
        frames_tree.root, tmp_path / "k.npy", skip_bad_frames=True, progress=False
    )
    index = load_index(result.dst, result.manifest)
    bad_key = f"{frames_tree.bad[0].parent.name}/{frames_tree.bad[0].name}"
    keys = load_keys(result.dst)
    assert bad_key in keys
    bad_frames = len(list(frames_tree.bad[0].iterdir()))
    assert index["count"][keys.index(bad_key)] == bad_frames - 1
    dropped = [s for s in result.manifest.skipped if s["reason"].startswith("frame dropped")]
    assert len(dropped) == 1 and "truncated JPEG" in dropped[0]["reason"]
    assert "padding overhead" in result.summary()


def test_pyav_missing_names_the_extra(
    files_tree: VideoTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_av(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "av" or name.startswith("av."):
            raise ImportError("No module named 'av'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_av)
    with pytest.raises(PackerError, match=r"pip install \"packer-datasets\[video\]\""):
        convert_video(files_tree.root, tmp_path / "x.npy", progress=False)
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "x.npy.partial").exists()


def test_bad_arguments_and_destinations(
    frames_tree: VideoTree, packed: dict, tmp_path: Path
) -> None:
    cases: list[tuple[dict, str]] = [
        ({"max_side": 32, "short_side": 32}, "exclusive"),
        ({"quality": 0}, "invalid quality"),
        ({"fps": 5}, "--fps applies to video files only"),
        ({"max_side": -1}, "invalid max-side"),
    ]
    for kwargs, message in cases:
        with pytest.raises(PackerError, match=message):
            convert_video(frames_tree.root, tmp_path / "x.npy", progress=False, **kwargs)
    with pytest.raises(DestinationError, match="--overwrite"):
        convert_video(frames_tree.root, packed[".npy"], progress=False)
    with pytest.raises(DestinationError, match="unknown destination suffix"):
        convert_video(frames_tree.root, tmp_path / "x.zip", progress=False)


def test_image_datasets_refuse_video_outputs(packed: dict) -> None:
    from packer.read.datasets import NPYDataset

    with pytest.raises(PackerError, match="not images"):
        NPYDataset(packed[".npy"])


def test_video_demo_runs(tmp_path: Path) -> None:
    tree, results, rows = run_video_demo(
        tmp_path, classes=2, per_class=2, frames=(8, 10), size=(64, 48), repeats=1, progress=False
    )
    assert [r.name for r in rows] == ["jpeg frames", "lmdb", "h5", "npy", "bmp"]
    assert all(r.bytes_per_s > 0 and r.decoded_per_s > 0 for r in rows)
    assert all(r.manifest.num_samples == len(tree.videos) for r in results)


def test_a_corrupt_scan_frame_is_caught_and_on_error_skip_serves_another(
    frames_tree: VideoTree, tmp_path: Path
) -> None:
    import shutil

    from harness.damage import corrupt_scan

    from packer.errors import InputFileError

    src = Path(shutil.copytree(frames_tree.root, tmp_path / "src"))
    frame = sorted((src / "class_00" / "video_000").glob("*.jpg"))[2]
    corrupt_scan(frame)
    caught = convert_video(src, tmp_path / "scan.npy", progress=False)  # the default check
    assert "class_00/video_000" not in list(open_video_dataset(caught.dst).keys)
    assert any("video_000" in s["path"] for s in caught.manifest.skipped)
    lenient = convert_video(src, tmp_path / "fast.npy", check="fast", progress=False)
    strict = open_video_dataset(lenient.dst, num_frames=16, output="numpy")
    bad = list(strict.keys).index("class_00/video_000")
    with pytest.raises(InputFileError, match="cannot be decoded"):
        strict[bad]
    skip = open_video_dataset(lenient.dst, num_frames=16, output="numpy", on_error="skip")
    clip, label = skip[bad]
    assert np.array_equal(clip, strict[bad + 1][0]) and label == strict[bad + 1][1]
    assert skip.replaced == 1
