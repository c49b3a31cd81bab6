"""Doctests of optional parts: an example that needs an extra runs where
the extra is installed and is skipped, saying which, where it is not."""
import importlib.util

import pytest

# module whose examples need an extra: the package the extra installs
_EXTRAS = {"rlplay.engine.rollout.cluster": "ray"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.DoctestItem):
            continue
        needs = _EXTRAS.get(item.dtest.globs.get("__name__", ""))
        if needs and importlib.util.find_spec(needs) is None:
            item.add_marker(pytest.mark.skip(
                reason=f"the example needs {needs} (an optional extra)"))
