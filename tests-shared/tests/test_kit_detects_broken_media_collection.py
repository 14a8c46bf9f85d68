"""The collection section fails a media store that declares `media_collection` but breaks its guarantees.

Each store below lies in one way that would let a collection running beside a writer take a blob
about to be referenced; the section must catch it, and the report must say FAILED.
"""

import pytest

pytest_plugins = ['pytester']

INI = '[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n'
OPT_IN = "pytest_plugins = ['stepcore_conformance']\n"

BROKEN_MEDIA = """
import pytest

from stepcore.backend import digest_of_uri, media_uri
from stepcore_conformance import InMemoryMediaStore, MediaCollectionConformance


class KeepsFirstPutTime(InMemoryMediaStore):
    async def put(self, data, *, context=None):
        digest = digest_of_uri(media_uri(data))
        times = self.port.stored_us  # the in-memory port's put times
        before = times.get(digest)
        uri = await super().put(data)
        if before is not None:
            times[digest] = before  # a put of stored bytes does not count as a put
        return uri


class DeletesWhateverItsAge(InMemoryMediaStore):
    async def delete_media(self, uri, *, older_than=None):
        return await super().delete_media(uri)


class TestKeepsFirstPutTime(MediaCollectionConformance):
    @pytest.fixture
    async def media_store(self):
        return KeepsFirstPutTime()


class TestDeletesWhateverItsAge(MediaCollectionConformance):
    @pytest.fixture
    async def media_store(self):
        return DeletesWhateverItsAge()
"""


def test_lying_media_stores_fail_and_the_report_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makeconftest(OPT_IN)
    pytester.makepyfile(test_broken_media=BROKEN_MEDIA)  # pyright: ignore[reportUnknownMemberType]
    outcome = pytester.runpytest_inprocess('-rfEs', '-p', 'no:cacheprovider')
    lines = outcome.stdout.fnmatch_lines
    lines(['FAILED*TestKeepsFirstPutTime::test_a_put_of_stored_bytes_makes_the_blob_young_again*'])
    lines(['FAILED*TestKeepsFirstPutTime::test_delete_media_keeps_a_blob_put_again_after_it_was_listed*'])
    lines(['FAILED*TestDeletesWhateverItsAge::test_delete_media_keeps_a_blob_put_again_after_it_was_listed*'])
    lines(['*TestDeletesWhateverItsAge*', '*features: media_collection: FAILED (*failed: *'])
    lines(['*TestKeepsFirstPutTime*', '*features: media_collection: FAILED (*failed: *'])
