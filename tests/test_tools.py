"""The diagnosis and demo rooms (once packer.tools): the public names still resolve; the floors
contracts of pyproject.toml keep every lower floor from importing them (tests/test_architecture.py)."""

from __future__ import annotations

import packer
import packer.video


def test_public_names_of_the_moved_modules_resolve() -> None:
    from packer.demo.video import make_video_files, make_video_tree, run_video_demo
    from packer.diagnosis.diagnose import LoaderReport, diagnose
    from packer.diagnosis.worker_threads import worker_init_fn

    assert (packer.diagnose, packer.LoaderReport) == (diagnose, LoaderReport)
    assert packer.worker_init_fn is worker_init_fn
    assert packer.video.make_video_tree is make_video_tree
    assert packer.video.make_video_files is make_video_files
    assert packer.video.run_video_demo is run_video_demo


def test_photo_like_makes_images_of_any_size() -> None:
    """The generator draws shapes on a 1×1 pixel as on a photo (it raised numpy's ValueError
    under 42 px), and a photo-sized image is the same one as before for the same seed."""
    import numpy as np

    from packer.demo.image import photo_like

    for size in ((1, 1), (7, 40), (41, 41), (64, 48)):
        assert photo_like(np.random.default_rng(0), *size).size == size
    a = np.asarray(photo_like(np.random.default_rng(5), 64, 48))
    assert np.array_equal(a, np.asarray(photo_like(np.random.default_rng(5), 64, 48)))
