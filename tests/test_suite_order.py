"""The suite's own order (tests/conftest.py): a long file renamed or removed would silently lose its place."""

from tests.conftest import LONG_FILES_FIRST
from tests.helpers import REPO_ROOT


def test_every_long_file_first_is_a_test_file_listed_once():
    assert len(set(LONG_FILES_FIRST)) == len(LONG_FILES_FIRST)
    assert [name for name in LONG_FILES_FIRST if not (REPO_ROOT / name).is_file()] == []
