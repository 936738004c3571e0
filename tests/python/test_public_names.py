"""The package's public names: every error class at the top level (the README
writes ``ddplug.Aborted``), ``__all__`` complete, and every ``ddplug.<name>`` the
README mentions exists."""

from __future__ import annotations

import importlib
import re

import ddplug
from ddplug import errors

from conftest import ROOT


def resolve(dotted: str) -> object:
    """``ddplug.<dotted>``: attributes, importing submodules on the way."""
    obj: object = ddplug
    path = "ddplug"
    for part in dotted.split("."):
        path += "." + part
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(path)
    return obj


def test_every_error_class_is_exported_at_the_top_level() -> None:
    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.DdplugError)}
    assert {errors.Aborted, errors.PeerLost, errors.Timeout, errors.AuditFailed} <= classes
    for cls in classes:
        assert getattr(ddplug, cls.__name__) is cls, cls.__name__
        assert cls.__name__ in ddplug.__all__, cls.__name__
    for name in errors.status_names().values():  # every status the library knows has its class
        if name != "OK":
            assert errors.class_for(name) in classes


def test_all_names_resolve() -> None:
    for name in ddplug.__all__:
        assert resolve(name) is not None, name


def test_the_readme_names_exist() -> None:
    text = (ROOT / "hosts" / "python" / "README.md").read_text()
    names = set(re.findall(r"(?<![\w\"'/.-])ddplug\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text))
    assert {"Aborted", "lightning.DdplugStrategy", "run_once"} <= names
    for name in sorted(names):
        resolve(name)  # raises if the README names something that does not exist
