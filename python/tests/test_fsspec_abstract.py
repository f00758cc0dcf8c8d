"""fsspec's own abstract test suite (``fsspec.tests.abstract``: copy, get, put, open and
pipe) against ``locus://``, as fsspec's filesystems run it against themselves."""

import posixpath

import fsspec
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.open import AbstractOpenTests
from fsspec.tests.abstract.pipe import AbstractPipeTests
from fsspec.tests.abstract.put import AbstractPutTests


class LocusFixtures(AbstractFixtures):
    """The suite's fixtures on a real ``locus serve`` (``conftest.server``): every test
    works under ``/fsspec-abstract`` of its export."""

    @pytest.fixture
    def fs(self, server):
        return fsspec.filesystem("locus", host="127.0.0.1", port=server["port"])

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self):
        return "/fsspec-abstract"


class TestLocusCopy(AbstractCopyTests, LocusFixtures):
    pass


class TestLocusGet(AbstractGetTests, LocusFixtures):
    pass


class TestLocusPut(AbstractPutTests, LocusFixtures):
    pass


class TestLocusOpen(AbstractOpenTests, LocusFixtures):
    pass


class TestLocusPipe(AbstractPipeTests, LocusFixtures):
    pass
