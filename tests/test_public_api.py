"""The public API people hold: every name in ``packer.__all__`` resolves, and the names a user
catches or calls are the real classes and functions (not modules of the same name)."""

from __future__ import annotations

import inspect

import pytest

import packer
from packer import errors


@pytest.mark.parametrize("name", packer.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(packer, name) is not None


def test_errors_are_public_and_one_family() -> None:
    for cls in (
        packer.SourceError,
        packer.DestinationError,
        packer.FormatError,
        packer.InputFileError,
    ):
        assert issubclass(cls, packer.PackerError)
    public = {n for n in packer.__all__ if n.endswith("Error")}
    defined = {
        n for n, v in vars(errors).items() if inspect.isclass(v) and issubclass(v, Exception)
    }
    assert defined <= public


def test_merge_and_verify_are_functions() -> None:
    assert inspect.isfunction(packer.merge) and inspect.isfunction(packer.verify)
    assert inspect.isclass(packer.VerifyReport) and inspect.isclass(packer.Problem)
