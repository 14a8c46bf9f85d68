"""The kit's own structure: sections never shadow each other's tests."""

from collections import defaultdict

from stepcore_conformance import MediaStoreConformance, StepStoreConformance

MEDIA_SECTIONS = ('MediaCollectionConformance', 'MediaSubclassConformance')
"""Sections of the media-store suite (`MediaStoreConformance`), not of the step-store one."""


def test_no_two_sections_define_the_same_test() -> None:
    owners: dict[str, list[str]] = defaultdict(list)
    for section in StepStoreConformance.__mro__[1:]:
        for name in vars(section):
            if name.startswith('test_'):
                owners[name].append(section.__name__)
    shadowed = {name: classes for name, classes in owners.items() if len(classes) > 1}
    assert not shadowed, f'a combined class keeps only one of each: {shadowed}'


def test_every_section_is_part_of_the_combined_class() -> None:
    import stepcore_conformance

    sections = [
        getattr(stepcore_conformance, name)
        for name in stepcore_conformance.__all__
        if name.endswith('Conformance') and name not in ('StepStoreConformance', 'MediaStoreConformance')
    ]
    assert sections
    for section in sections:
        combined = MediaStoreConformance if section.__name__ in MEDIA_SECTIONS else StepStoreConformance
        assert issubclass(combined, section), section
