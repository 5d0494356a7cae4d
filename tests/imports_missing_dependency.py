"""A tool module whose own import fails (tests/test_tool_catalog.py): a dependency it
names is not installed, which its traceback shows."""

import cowrite_no_such_dependency  # type: ignore[import-not-found]  # noqa: F401
