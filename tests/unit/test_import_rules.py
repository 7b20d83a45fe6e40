"""The import direction of ARCHITECTURE.md, read from the source with ``ast`` (imports inside
functions included): ``protocol`` imports no asyncio, sockets or Strata package but ``common``;
``log`` imports no asyncio and none of the packages that sit on it; ``tiered.api`` imports only
``common``; ``net`` (client connections) only ``common`` and ``protocol``; nothing but ``cli``
and ``broker`` imports ``server``, so ``spark`` never does; nothing but ``cli`` imports ``broker``; ``protocol``'s modules import each other without a
cycle; the server never asks ``getattr(ctx, ...)`` nor probes a context's member (``ctx.metadata``, ``rlm.ctx.rsm``) in ``server``, ``broker`` or ``tiered.manager``; nothing imports the benchmarks (the top-level ``benchmarks`` package); a coordinator
package (``coordinator.group``) is imported by its name only, never by its modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import strata

ROOT = Path(strata.__file__).parent


def _imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = found.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names  # modules
                             if _is_module(f"{node.module}.{alias.name}"))
            elif isinstance(node, ast.ImportFrom):
                raise AssertionError(f"{module}: relative import (the project writes absolute ones)")
    return found


def _is_module(name: str) -> bool:
    """Whether ``name`` (as in ``from strata.x import y``) is a module of Strata's."""
    if not name.startswith("strata."):
        return False
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


IMPORTS = _imports()


def _package(name: str) -> str:
    """``strata.x`` of ``strata.x.y``; the top-level name of anything else."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "strata" else parts[0]


def _breaking(prefix: str, allowed) -> list[str]:
    return sorted(f"{module} imports {name}" for module, names in IMPORTS.items()
                  if module == prefix or module.startswith(prefix + ".")
                  for name in names if not allowed(name))


def _strata_only(*packages: str):
    return lambda name: not name.startswith("strata") or _package(name) in packages


def test_the_rules_see_every_package():
    assert {_package(m) for m in IMPORTS} >= {
        "strata.protocol", "strata.log", "strata.tiered", "strata.net", "strata.server",
        "strata.spark", "strata.cli", "strata.broker"}
    assert "asyncio" in IMPORTS["strata.net.connection"]   # imports inside modules are read


def test_protocol_is_sans_io():
    strata_ok = _strata_only("strata.common", "strata.protocol")
    assert _breaking("strata.protocol", lambda n: n.split(".")[0] not in (
        "asyncio", "socket", "selectors", "uvloop") and strata_ok(n)) == []


def test_protocol_imports_nothing_of_the_log():
    """The format is ``protocol``'s, what the log checks and rewrites on append is ``log``'s
    (``log_validator``, Kafka's ``LogValidator``): ``log`` reads the format, never the other way
    round. Implied by the rule above, and stated on its own so that it outlives any loosening of
    it."""
    assert _breaking("strata.protocol", lambda n: _package(n) != "strata.log") == []


def _cycles(prefix: str) -> list[list[str]]:
    """The import cycles among the modules under ``prefix`` (one path per cycle found)."""
    graph = {m: sorted(n for n in names if n in IMPORTS and n != m and n.startswith(prefix + "."))
             for m, names in IMPORTS.items() if m.startswith(prefix + ".")}
    cycles, done, path = [], set(), []

    def visit(m: str) -> None:
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        path.append(m)
        for n in graph.get(m, ()):
            visit(n)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    return cycles


def test_protocol_modules_import_each_other_without_a_cycle():
    """Kafka's wire primitives live in ``protocol.wire``, which every codec imports; no codec
    borrows another's (``produce_wire`` once took ``codec``'s inside a function)."""
    assert _cycles("strata.protocol") == []


def test_the_cycle_finder_sees_imports_of_modules_by_name():
    assert "strata.protocol.produce_wire" in IMPORTS["strata.protocol.codec"]   # from x import y


def test_the_local_log_imports_no_asyncio_and_nothing_built_on_it():
    assert _breaking("strata.log", lambda n: n.split(".")[0] not in ("asyncio", "uvloop") and
                     _strata_only("strata.common", "strata.protocol", "strata.log")(n)) == []


def test_the_tiered_storage_api_imports_only_common():
    assert _breaking("strata.tiered.api", _strata_only("strata.common")) == []


def test_client_connections_import_only_common_and_protocol():
    assert _breaking("strata.net", _strata_only("strata.common", "strata.protocol",
                                                "strata.net")) == []


@pytest.mark.parametrize("package", sorted({_package(m) for m in IMPORTS}
                                           - {"strata", "strata.server", "strata.cli",
                                              "strata.broker"}))
def test_nothing_but_the_entry_points_imports_the_server(package):
    assert _breaking(package, lambda n: _package(n) != "strata.server") == []


@pytest.mark.parametrize("package", sorted({_package(m) for m in IMPORTS}
                                           - {"strata", "strata.broker", "strata.cli"}))
def test_nothing_but_the_entry_point_imports_the_broker(package):
    """The broker (wiring, metadata publishers) sits above ``server``, ``replication``,
    ``tiered`` and ``coordinator``: none of them may reach up into it."""
    assert _breaking(package, lambda n: _package(n) != "strata.broker") == []


def test_replication_takes_only_the_partition_states_from_the_cluster():
    """Replication leads and follows by the controller's partition states (``cluster.image``,
    value types only); the cluster's stores and controller sit above it."""
    assert _breaking("strata.replication", lambda n: _package(n) != "strata.cluster"
                     or n == "strata.cluster.image") == []


def test_nothing_in_strata_imports_the_benchmarks():
    """The harnesses are the top-level ``benchmarks`` package, installed beside the test extra and
    not shipped in the ``strata`` wheel: the product must run without them."""
    assert not (ROOT / "bench").exists()
    assert _breaking("strata", lambda n: n.split(".")[0] != "benchmarks") == []


COORDINATOR_PACKAGES = ["strata.coordinator.group"]


@pytest.mark.parametrize("package", COORDINATOR_PACKAGES)
def test_a_coordinator_package_is_imported_by_its_name_only(package):
    """A coordinator package's modules (state machine, membership, offsets, loader, ...) are
    its own business: every other module imports the names its ``__init__`` exports, so the
    package can be reshaped (the next group protocols land in it) without touching them."""
    assert any(name == package for names in IMPORTS.values() for name in names)
    assert sorted(f"{module} imports {name}" for module, names in IMPORTS.items()
                  if not (module == package or module.startswith(package + "."))
                  for name in names if name.startswith(package + ".")) == []



def _on_the_context(target: ast.expr, names: tuple[str, ...] = ("ctx",)) -> bool:
    """Whether ``target`` is a context (``ctx``, ``self.ctx``, ``rlm.ctx``; ``self`` too in
    the context's own module) or reached through one (``ctx.metadata``, ``self.ctx.rlmm``,
    ``ctx.replica_manager.remote_log_manager``)."""
    while isinstance(target, ast.Attribute):
        if target.attr == "ctx":
            return True
        target = target.value
    return isinstance(target, ast.Name) and target.id in names


def _context_probes(source: str, names: tuple[str, ...] = ("ctx",)) -> list[int]:
    """The lines of ``getattr``/``hasattr`` calls on a context or on one of its members."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args
                and _on_the_context(node.args[0], names)):
            found.append(node.lineno)
    return sorted(found)


def test_the_probe_finder_sees_getattr_and_hasattr_on_the_context_and_its_members():
    assert _context_probes("getattr(ctx, 'x', None)\nhasattr(self.ctx, 'y')\n"
                           "getattr(body, 'z', -1)\nctx.quotas\n"
                           "getattr(ctx.metadata, 'read_replicas', None)\n"
                           "hasattr(rlm.ctx.rsm.store, 'inner')\n"
                           "getattr(self.context, 'x', None)\ngetattr(p.ctx_id, 'x')\n") == [1, 2, 5, 6]
    assert _context_probes("hasattr(self.metadata, 'advertised_endpoints')\n",
                           names=("ctx", "self")) == [1]


def test_the_server_never_probes_the_context_with_getattr():
    """Every part of the broker context is a declared field (``server.context``, its ports in
    ``server.ports``); an optional one is a null object or ``None`` by declaration. A handler
    that asks ``getattr(ctx, ...)`` depends on something no type declares."""
    assert [f"{path.relative_to(ROOT.parent)}:{line}"
            for path in sorted((ROOT / "server").rglob("*.py"))
            for line in _context_probes(path.read_text())] == []


@pytest.mark.parametrize("package", ["server", "broker", "tiered/manager"])
def test_no_part_of_a_context_is_probed(package):
    """Nor a member of a context: the cluster metadata's optional parts (``read_replicas``)
    are declared on its port with a null object, and what the remote log manager and the
    broker ask of the metadata and storage managers (``rlm.ctx.rlmm``, ``rlm.ctx.rsm``) is
    declared on ``tiered.api``'s classes, with defaults."""
    assert [f"{path.relative_to(ROOT.parent)}:{line}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line in _context_probes(path.read_text())] == []


def test_the_context_probes_none_of_its_own_members():
    """``BrokerContext`` itself (``self`` there) asks nothing of its parts that their ports do
    not declare."""
    assert _context_probes((ROOT / "server" / "context.py").read_text(), names=("ctx", "self")) == []
