"""packer.tools sits above the core: the public names still resolve, and no core module imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import packer
import packer.video

PACKAGE = Path(packer.__file__).parent
# The only modules allowed to reach packer.tools: the command line and the demo (the floors above)
# and the facades, lazily, for public names.
ALLOWED = {"cli/app.py", "cli/measure.py", "__init__.py", "video/__init__.py", "demo/image.py"}


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_core_module_imports_tools() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("tools/") or relative in ALLOWED:
            continue
        if any(
            m == "packer.tools" or m.startswith("packer.tools.") for m in _imported_modules(path)
        ):
            offenders.append(relative)
    assert offenders == []


def test_public_names_of_the_moved_modules_resolve() -> None:
    from packer.demo.video import make_video_files, make_video_tree, run_video_demo
    from packer.tools.diagnose import LoaderReport, diagnose
    from packer.tools.worker_threads import worker_init_fn

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
