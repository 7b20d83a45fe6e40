"""A Spark worker's import caches: what trim_import_caches drops and what it keeps; what
prepare_worker freezes for the GC, and where."""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
import zipimport

import pytest

from strata.spark.worker_env import trim_import_caches


def test_a_jar_without_python_leaves_sys_path_and_one_with_python_stays(tmp_path, monkeypatch):
    classes = tmp_path / "spark-core.jar"
    with zipfile.ZipFile(classes, "w") as z:
        z.writestr("org/apache/spark/SparkContext.class", b"\xca\xfe\xba\xbe")
    packaged = tmp_path / "with-python.jar"
    with zipfile.ZipFile(packaged, "w") as z:
        z.writestr("strata_test_pkg_in_jar/__init__.py", "VALUE = 7\n")
    missing = str(tmp_path / "gone.jar")
    monkeypatch.setattr(sys, "path", [str(classes), str(packaged), missing, *sys.path])
    importlib.invalidate_caches()
    with pytest.raises(ImportError):              # a search of every path entry
        importlib.import_module("strata_test_no_such_module")
    assert str(classes) in sys.path_importer_cache

    trim_import_caches()

    assert str(classes) not in sys.path and str(classes) not in sys.path_importer_cache
    assert str(packaged) in sys.path and missing in sys.path
    assert importlib.import_module("strata_test_pkg_in_jar").VALUE == 7
    sys.modules.pop("strata_test_pkg_in_jar", None)


def test_zip_importers_are_dropped_and_an_import_after_reads_the_archive_afresh(tmp_path,
                                                                               monkeypatch):
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("strata_zpkg/__init__.py", "")
        z.writestr("strata_zpkg/sub/__init__.py", "")
        z.writestr("strata_zpkg/sub/a.py", "A = 1\n")
        z.writestr("strata_zpkg/sub/b.py", "B = 2\n")
    monkeypatch.setattr(sys, "path", [str(archive), *sys.path])
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    try:
        assert importlib.import_module("strata_zpkg.sub.a").A == 1
        ours = [k for k, f in sys.path_importer_cache.items()
                if isinstance(f, zipimport.zipimporter) and f.archive == str(archive)]
        assert len(ours) >= 2       # the archive's and one per package imported from it

        trim_import_caches()

        assert not [f for f in sys.path_importer_cache.values()
                    if isinstance(f, zipimport.zipimporter)]   # invalidate_caches reads nothing
        importlib.invalidate_caches()
        assert importlib.import_module("strata_zpkg.sub.b").B == 2
        with zipfile.ZipFile(archive, "a") as z:                # changed after the trim
            z.writestr("strata_zpkg/sub/c.py", "C = 3\n")
        trim_import_caches()
        importlib.invalidate_caches()
        assert importlib.import_module("strata_zpkg.sub.c").C == 3
    finally:
        for name in ("strata_zpkg.sub.c", "strata_zpkg.sub.b", "strata_zpkg.sub.a",
                     "strata_zpkg.sub", "strata_zpkg"):
            sys.modules.pop(name, None)


_FREEZE_PROBE = """
import gc, importlib.machinery, sys
if sys.argv[1] == "worker":     # as under python -m pyspark.daemon
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("pyspark.daemon", None)
from strata.spark.worker_env import prepare_worker
counts = [gc.get_freeze_count()]
prepare_worker()
counts.append(gc.get_freeze_count())
made_by_a_task = [[i] for i in range(1000)]
prepare_worker()
counts.append(gc.get_freeze_count())
assert "colorsys" not in sys.modules
import colorsys                 # a task that imports
prepare_worker()
counts.append(gc.get_freeze_count())
print(*counts)
"""


@pytest.mark.parametrize("process", ["worker", "driver"])
def test_a_pyspark_worker_freezes_what_exists_when_it_has_imported_more_and_a_driver_never(
        process):
    out = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, process], capture_output=True,
                         text=True, check=True).stdout.split()
    before, first, after_task, after_import = map(int, out)
    assert before == 0
    if process == "worker":
        assert first > 1000                 # the imports' objects: gc.collect skips them
        assert after_task == first          # nothing imported: what tasks make stays collectable
        assert after_import > after_task    # the new module's objects, and what lived with them
    else:
        assert first == after_task == after_import == 0
