"""What fences the tiering tasks by leadership (see ``TieringContext.leading_epoch``)."""

from __future__ import annotations


class LeadershipLost(Exception):
    """A tiering task's broker no longer leads its partition: the task ends where it is."""
