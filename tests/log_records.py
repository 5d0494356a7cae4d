"""The log records one logger emits, debug level included: the app's logging setup
stops cowrite's loggers propagating, so caplog does not see them."""

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def records_of(name: str) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign,assignment]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
