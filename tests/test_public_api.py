"""Every public name resolves and is documented."""

from __future__ import annotations

import inspect

import pytest

import envrunners


@pytest.mark.parametrize("name", envrunners.__all__)
def test_public_name_resolves_and_has_docstring(name):
    obj = getattr(envrunners, name)
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_unknown_name_is_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        envrunners.Nope  # noqa: B018
