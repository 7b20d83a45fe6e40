"""What Strata's entry points do first in a PySpark worker (``prepare_worker``): keep the
worker's per-call ``importlib.invalidate_caches()`` cheap, and its ``gc.collect()`` after
each task short.

Before every task and every planning call (``schema``, ``partitions``) a PySpark 4.0 worker
runs ``importlib.invalidate_caches()``. On Python 3.10 and 3.11 that makes every zip importer
in ``sys.path_importer_cache`` re-read its archive's whole directory (CPython gh-103200, made
lazy in 3.12), and the cache holds one importer per package imported out of a zip or jar:

- about 15 for ``pyspark.zip`` (one per package: ``pyspark/sql``, ``pyspark/errors``, ...);
- one for spark-core's jar, which Spark puts on the worker's path (thousands of entries).

A query makes several such calls one after another (their cost: docs/architecture.md, Spark).
``trim_import_caches`` brings the next call's re-reads to none: it drops every zip importer, and
each archive's cached directory with it, so an archive is read again only when an import next
searches it (what Python 3.12 does).
"""

from __future__ import annotations

import gc
import sys
import zipfile
import zipimport

__all__ = ["prepare_worker", "trim_import_caches"]

_kept_jars: set[str] = set()   # jars on the path that hold Python: not listed again
_modules_frozen = 0             # len(sys.modules) at the last gc.freeze()


def prepare_worker() -> None:
    """Call first at every entry point that runs in a Spark worker: ``trim_import_caches``,
    and in a PySpark worker process, ``gc.freeze()`` whenever modules were imported since
    the last freeze.

    A reused PySpark worker runs a full ``gc.collect()`` after every task, and every
    planning call is a task of such a worker. With PySpark, pyarrow, numpy and Strata's
    reading code imported that walks every object they made, each call, while the other task
    or the next stage wants the core (its cost: docs/architecture.md, Spark).
    Freezing takes what exists out of those collections. It happens when ``sys.modules`` has
    grown: at the first entry, and at the next after a task that imported more (the read
    path imports most of what it uses on first use); by then the collection after that task
    has left only live objects, and imports create objects that live as long as the process.
    Once a worker imports nothing new it freezes no more, so what later tasks make stays
    collectable. A driver or any other process keeps its GC as it is."""
    global _modules_frozen
    trim_import_caches()
    if len(sys.modules) != _modules_frozen and _in_pyspark_worker():
        _modules_frozen = len(sys.modules)
        gc.freeze()


def _in_pyspark_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", "").startswith("pyspark.")


def trim_import_caches() -> None:
    """Take ``.jar`` files that hold no Python off ``sys.path``, and drop every zip importer
    from ``sys.path_importer_cache``, with its archive's directory in ``zipimport``'s cache.

    Neither changes what an import finds: a jar without Python modules cannot serve one, and
    the import system makes an importer again when it next searches that path, reading the
    archive afresh then (so a changed archive is seen, as ``invalidate_caches`` promises).
    Modules already imported keep their loaders. Cheap when there is nothing to drop; call
    it at each worker entry point, after PySpark's own imports for the call."""
    for entry in [e for e in sys.path if isinstance(e, str) and e.endswith(".jar")]:
        if entry in _kept_jars:
            continue
        try:
            with zipfile.ZipFile(entry) as jar:
                if any(n.endswith((".py", ".pyc")) for n in jar.namelist()):
                    _kept_jars.add(entry)
                    continue
        except (OSError, zipfile.BadZipFile):
            continue
        sys.path[:] = [e for e in sys.path if e != entry]
        sys.path_importer_cache.pop(entry, None)
    directories = getattr(zipimport, "_zip_directory_cache", {})
    for key, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            sys.path_importer_cache.pop(key, None)
            directories.pop(finder.archive, None)
