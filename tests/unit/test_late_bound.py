"""LateBound: a collaborator made after its user, given to the user's constructor and set once."""

import pytest

from strata.common.late_bound import LateBound


def test_a_late_bound_part_is_none_until_set_and_set_only_once():
    fetchers = LateBound("follower fetchers")
    assert fetchers.get() is None
    fetchers.set("the fetchers")
    assert fetchers.get() == "the fetchers"
    with pytest.raises(RuntimeError, match="follower fetchers is already set"):
        fetchers.set("other fetchers")
    assert fetchers.get() == "the fetchers"


def test_of_takes_a_late_bound_part_as_it_is_and_wraps_a_part_given_at_once():
    slot = LateBound("remote log manager")
    assert LateBound.of("remote log manager", slot) is slot
    assert LateBound.of("remote log manager", "rlm").get() == "rlm"
    assert LateBound.of("remote log manager", None).get() is None
