"""The strata source's reader takes Python-less jars off a Spark worker's sys.path."""

from __future__ import annotations

import importlib
import sys
import zipfile

import pytest

pytest.importorskip("pyspark")

from strata.spark import source  # noqa: E402


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
    with pytest.raises(ImportError):                # a search of every path entry
        importlib.import_module("strata_test_no_such_module")
    assert str(classes) in sys.path_importer_cache

    source._drop_jars_from_sys_path()

    assert str(classes) not in sys.path and str(classes) not in sys.path_importer_cache
    assert str(packaged) in sys.path and missing in sys.path
    assert importlib.import_module("strata_test_pkg_in_jar").VALUE == 7
    sys.modules.pop("strata_test_pkg_in_jar", None)
