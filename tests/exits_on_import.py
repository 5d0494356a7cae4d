"""A tool module that calls sys.exit() when imported (tests/test_tool_catalog.py)."""

raise SystemExit(3)
