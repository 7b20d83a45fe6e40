"""The remote log manager: tiering tasks, remote reads and their caches."""
