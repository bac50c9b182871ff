"""What issue 29 folded into one place stays one: convert and plan_conversion take the same
parameters, the shard cache and upload staging share one default folder (``~`` expanded in
both), and every remote retry is one loop with one plan."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from packer.core.cpus import packer_home
from packer.core.retry import Retry, retried
from packer.remote.cache import ShardCache, default_cache_dir
from packer.upload.staging import staging_root
from packer.write.convert import convert
from packer.write.plan import plan_conversion


def test_convert_and_plan_conversion_take_the_same_parameters() -> None:
    ours = inspect.signature(convert).parameters
    plans = inspect.signature(plan_conversion).parameters
    assert list(ours) == list(plans)
    for name in ours:
        a, b = ours[name], plans[name]
        assert (a.kind, a.default, str(a.annotation)) == (b.kind, b.default, str(b.annotation)), (
            name
        )


def test_one_default_folder_with_the_home_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PACKER_CACHE_DIR", "~/packer-cache")
    assert default_cache_dir() == staging_root().parent == tmp_path / "packer-cache"
    monkeypatch.delenv("PACKER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert packer_home() == default_cache_dir() == tmp_path / "xdg" / "packer"
    assert staging_root() == tmp_path / "xdg" / "packer" / "staging"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert packer_home() == tmp_path / ".cache" / "packer"
    cache = ShardCache("~/mine")
    assert cache.dir == tmp_path / "mine"


class Flaky(Exception):
    pass


def test_one_retry_loop() -> None:
    plan = Retry(attempts=4, base=0.001, cap=0.002)
    tries: list[int] = []

    def twice_then_ok(attempt: int) -> str:
        tries.append(attempt)
        if attempt < 3:
            raise Flaky(f"try {attempt}")
        return "ok"

    def give_up(exc: Exception, attempts: int, spent: float) -> RuntimeError:
        return RuntimeError(f"{attempts} tries, last {exc}")

    assert retried(plan, twice_then_ok, lambda e: isinstance(e, Flaky), give_up) == "ok"
    assert tries == [1, 2, 3]

    def always(attempt: int) -> str:
        raise Flaky(f"try {attempt}")

    with pytest.raises(RuntimeError, match="4 tries, last try 4") as caught:
        retried(plan, always, lambda e: isinstance(e, Flaky), give_up)
    assert isinstance(caught.value.__cause__, Flaky)

    def denied(attempt: int) -> str:
        tries.append(attempt)
        raise PermissionError("403")

    tries.clear()
    with pytest.raises(PermissionError):
        retried(plan, denied, lambda e: isinstance(e, Flaky), give_up)
    assert tries == [1]  # not worth another try: raised at once
