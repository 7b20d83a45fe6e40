"""Run Apache Kafka's own tools (installed from Maven Central) from tests.

The jars are installed by ``scripts/kafka-dist.sh`` into ``.cache/kafka/<version>/libs``
(first use takes a few seconds with a warm ``~/.m2``; later uses are free). Typical use::

    from kafka_tools import kafka_dist_available, dump_log_segments, parse_dump_batches
    # (tests/ has no __init__.py: put tests/ on sys.path first -- e.g. pytest's
    #  ``pythonpath = ["tests"]`` -- or insert it from the test module)

    ok, reason = kafka_dist_available()
    if not ok:
        pytest.skip(reason)
    text = dump_log_segments(seg_dir / "00000000000000000000.log")
    batches = parse_dump_batches(text)

Output formats (Kafka 4.4.0, ``org.apache.kafka.tools.DumpLogSegments``)::

    Dumping /tmp/x/00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1
      producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false
      deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1700000000001 size: 88
      magic: 2 compresscodec: none crc: 123456789 isvalid: true          (one line)
    | offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 2 sequence: -1 headerKeys: []
    Dumping /tmp/x/00000000000000000000.index
    offset: 1 position: 0
    Dumping /tmp/x/00000000000000000000.timeindex
    timestamp: 1700000000001 offset: 1

Index problems go to **stderr**; ``dump_log_segments`` therefore returns stdout
followed by stderr, and :func:`dump_reports_index_errors` picks them out.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_DIST_SCRIPT = REPO_ROOT / "scripts" / "kafka-dist.sh"

# Kafka 4.x moved DumpLogSegments from core (kafka.tools, Scala) to the tools
# module (org.apache.kafka.tools, Java). We look for the new one first so an
# overridden KAFKA_VERSION=4.0.x still works.
DUMP_LOG_SEGMENTS_CLASSES = ("org.apache.kafka.tools.DumpLogSegments", "kafka.tools.DumpLogSegments")

# Main classes of the 4.x CLI tools (bin/*.sh wrappers in the real distribution).
KAFKA_TOPICS = "org.apache.kafka.tools.TopicCommand"
KAFKA_CONFIGS = "org.apache.kafka.tools.ConfigCommand"    # kafka.admin.ConfigCommand up to 4.3
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
BROKER_API_VERSIONS = "org.apache.kafka.tools.BrokerApiVersionsCommand"
KAFKA_ACLS = "org.apache.kafka.tools.AclCommand"
KAFKA_FEATURES = "org.apache.kafka.tools.FeatureCommand"
LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"
REASSIGN_PARTITIONS = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
KAFKA_TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"


class KafkaDistUnavailable(RuntimeError):
    """java/mvn missing, or the Maven install failed."""


class KafkaToolError(RuntimeError):
    """A Kafka tool exited non-zero; carries its output."""

    def __init__(self, cmd: Sequence[str], returncode: int, stdout: str, stderr: str):
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"{' '.join(self.cmd)} exited with {returncode}\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )

    @property
    def output(self) -> str:
        return _join_output(self.stdout, self.stderr)


def _join_output(stdout: str, stderr: str) -> str:
    if stdout and not stdout.endswith("\n") and stderr:
        stdout += "\n"
    return stdout + stderr


@functools.lru_cache(maxsize=None)
def _install() -> tuple[Path | None, str]:
    """Run kafka-dist.sh once per process; (libs_dir, "") or (None, reason)."""
    missing = [tool for tool in ("java", os.environ.get("MVN", "mvn")) if shutil.which(tool) is None]
    if missing:
        return None, f"Kafka tools unavailable: {' and '.join(missing)} not found on PATH"
    try:
        proc = subprocess.run(
            [str(KAFKA_DIST_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"Kafka tools unavailable: {KAFKA_DIST_SCRIPT.name} failed: {exc}"
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-15:])
        return None, f"Kafka tools unavailable: {KAFKA_DIST_SCRIPT.name} exited {proc.returncode}: {tail}"
    lines = proc.stdout.strip().splitlines()
    libs = Path(lines[-1]) if lines else None
    if libs is None or not libs.is_dir():
        return None, f"Kafka tools unavailable: {KAFKA_DIST_SCRIPT.name} printed no libs dir: {proc.stdout!r}"
    return libs, ""


def require_kafka_dist() -> None:
    """Skip the calling test (or module fixture) with the reason when Kafka's jars are missing."""
    import pytest
    ok, reason = kafka_dist_available()
    if not ok:
        pytest.skip(reason)


def kafka_dist_available() -> tuple[bool, str]:
    """(True, "") if java+mvn exist and the Kafka jars are installed, else (False, reason)."""
    libs, reason = _install()
    return libs is not None, reason


def kafka_libs() -> Path:
    """The installed ``libs/`` dir (installs on first call); raises KafkaDistUnavailable."""
    libs, reason = _install()
    if libs is None:
        raise KafkaDistUnavailable(reason)
    return libs


def kafka_log4j_config() -> Path:
    return kafka_libs().parent / "log4j2.properties"


# The tools run for seconds: the C1 compiler alone and the serial collector start them on
# about half the CPU (JIT threads and GC workers would compete with the brokers on 2 cores).
QUICK_START_JVM_OPTS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def kafka_java_command(main_class: str, *args: str, heap: str = "-Xmx512m",
                       jvm_opts: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``main_class`` on the Kafka classpath (useful for Popen)."""
    libs = kafka_libs()
    return [
        "java", heap, *QUICK_START_JVM_OPTS, *jvm_opts,
        f"-Dlog4j2.configurationFile={kafka_log4j_config()}",
        "-cp", f"{libs}{os.sep}*",
        main_class, *args,
    ]


def run_kafka_class(main_class: str, *args: str, timeout: float = 120,
                    jvm_opts: Sequence[str] = (), input: str | None = None,
                    cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run a Kafka main class; text mode, stdout/stderr captured, no check."""
    cmd = kafka_java_command(main_class, *args, jvm_opts=jvm_opts)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          input=input, cwd=cwd, check=False)


def _jar_has_class(libs: Path, class_name: str) -> bool:
    entry = class_name.replace(".", "/") + ".class"
    for jar in sorted(libs.glob("kafka*.jar")):
        try:
            with zipfile.ZipFile(jar) as zf:
                zf.getinfo(entry)
                return True
        except (KeyError, zipfile.BadZipFile):
            continue
    return False


@functools.lru_cache(maxsize=None)
def dump_log_segments_class() -> str:
    libs = kafka_libs()
    for name in DUMP_LOG_SEGMENTS_CLASSES:
        if _jar_has_class(libs, name):
            return name
    raise KafkaDistUnavailable(f"no DumpLogSegments class ({DUMP_LOG_SEGMENTS_CLASSES}) in {libs}")


def dump_log_segments(*files: os.PathLike | str, deep_iteration: bool = True,
                      index_sanity_check: bool = False, verify_index_only: bool = False,
                      print_data: bool = False, extra_args: Iterable[str] = (),
                      timeout: float = 120, check: bool = True) -> str:
    """Run DumpLogSegments on ``files``; return stdout followed by stderr.

    ``index_sanity_check`` only runs the broker-startup sanity check on
    .index/.timeindex files (prints "<file> passed sanity check." and skips the
    per-entry verification). Without it each index entry is checked against the
    log and mismatches are reported on stderr (see dump_reports_index_errors).
    A failing sanity check throws in Java -> exit code 1 -> KafkaToolError
    (unless ``check=False``).
    """
    if not files:
        raise ValueError("dump_log_segments needs at least one file")
    args = ["--files", ",".join(str(Path(f)) for f in files)]
    if deep_iteration:
        args.append("--deep-iteration")
    if index_sanity_check:
        args.append("--index-sanity-check")
    if verify_index_only:
        args.append("--verify-index-only")
    if print_data:
        args.append("--print-data-log")
    args.extend(extra_args)
    proc = run_kafka_class(dump_log_segments_class(), *args, timeout=timeout)
    if check and proc.returncode != 0:
        raise KafkaToolError(proc.args, proc.returncode, proc.stdout, proc.stderr)
    return _join_output(proc.stdout, proc.stderr)


# --- output parsing ---------------------------------------------------------

_INT_FIELDS = {
    "baseOffset", "lastOffset", "count", "baseSequence", "lastSequence", "producerId",
    "producerEpoch", "partitionLeaderEpoch", "position", "CreateTime", "LogAppendTime",
    "NoTimestampType", "size", "magic", "crc", "offset",
}
_BOOL_FIELDS = {"isTransactional", "isControl", "isvalid"}
# "key: value" pairs; values never contain spaces in batch lines
# (deleteHorizonMs prints as "OptionalLong.empty" or "OptionalLong[123]").
_PAIR_RE = re.compile(r"(\w+): (\S+)")
# A batch line: v2 starts with "baseOffset:", v0/v1 with "offset: N position:".
_BATCH_LINE_RE = re.compile(r"^(?:baseOffset: -?\d+ .*|offset: -?\d+ position: -?\d+ \w+: .*)"
                            r" compresscodec: \S+ crc: -?\d+ isvalid: \w+$")
_INDEX_ENTRY_RE = re.compile(r"^offset: (-?\d+) position: (-?\d+)$")
_TIME_INDEX_ENTRY_RE = re.compile(r"^timestamp: (-?\d+) offset: (-?\d+)$")
_RECORD_LINE_RE = re.compile(r"^\| offset: (-?\d+) (\w+): (-?\d+) keySize: (-?\d+) valueSize: (-?\d+)(.*)$")


def _convert(key: str, value: str):
    if key in _INT_FIELDS:
        try:
            return int(value)
        except ValueError:
            return value
    if key in _BOOL_FIELDS:
        return value == "true"
    if key == "deleteHorizonMs":
        m = re.fullmatch(r"OptionalLong\[(-?\d+)\]", value)
        return int(m.group(1)) if m else None
    return value


def _dump_sections(text: str) -> list[tuple[str | None, list[str]]]:
    """Split output into (dumped file, lines) sections on "Dumping <file>" lines."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        if line.startswith("Dumping "):
            sections.append((line[len("Dumping "):].strip(), []))
        else:
            sections[-1][1].append(line)
    return sections


def parse_dump_batches(text: str) -> list[dict]:
    """Batch-level lines of a .log dump, in order.

    Each dict has the batch fields as printed (ints/bools converted), e.g.
    baseOffset, lastOffset, count, position, CreateTime or LogAppendTime, size,
    magic, compresscodec, crc, isvalid; plus ``file`` (the dumped file) and
    ``records``: the deep-iteration record lines (dicts with offset,
    timestampType, timestamp, keySize, valueSize, and sequence/headerKeys/payload
    where printed) -- empty without --deep-iteration.
    For magic 0/1 batches the line starts "offset: N" (the last offset);
    it is exposed as both ``offset`` and ``lastOffset``.
    """
    batches: list[dict] = []
    for file, lines in _dump_sections(text):
        if file is not None and not (file.endswith(".log") or file.endswith(".checkpoint")):
            continue
        current: dict | None = None
        for line in lines:
            if _BATCH_LINE_RE.match(line):
                current = {k: _convert(k, v) for k, v in _PAIR_RE.findall(line)}
                if "baseOffset" not in current:
                    current["lastOffset"] = current["offset"]
                for ts_key in ("CreateTime", "LogAppendTime", "NoTimestampType"):
                    if ts_key in current:
                        current["timestampType"] = ts_key
                        current["maxTimestamp"] = current[ts_key]
                current["file"] = file
                current["records"] = []
                batches.append(current)
                continue
            m = _RECORD_LINE_RE.match(line)
            if m and current is not None:
                rec = {
                    "offset": int(m.group(1)),
                    "timestampType": m.group(2),
                    "timestamp": int(m.group(3)),
                    "keySize": int(m.group(4)),
                    "valueSize": int(m.group(5)),
                }
                rest = m.group(6)
                sm = re.search(r" sequence: (-?\d+)", rest)
                if sm:
                    rec["sequence"] = int(sm.group(1))
                hm = re.search(r" headerKeys: \[([^\]]*)\]", rest)
                if hm:
                    rec["headerKeys"] = [h for h in hm.group(1).split(",") if h]
                km = re.search(r" key: (.*?)(?: payload: |$)", rest)
                if km:
                    rec["key"] = km.group(1)
                pm = re.search(r" payload: (.*)$", rest)
                if pm:
                    rec["payload"] = pm.group(1)
                current["records"].append(rec)
    return batches


def parse_dump_index_entries(text: str) -> list[dict]:
    """Entries of .index / .timeindex dumps, in order.

    ``offset: N position: M`` -> {"kind": "offset", "offset": N, "position": M, "file": ...}
    ``timestamp: T offset: O`` -> {"kind": "time", "timestamp": T, "offset": O, "file": ...}
    Lines inside .log sections are ignored (a magic<2 batch line also starts
    with "offset: N position: M" but has more fields).
    """
    entries: list[dict] = []
    for file, lines in _dump_sections(text):
        if file is not None and file.endswith((".log", ".checkpoint")):
            continue
        for line in lines:
            m = _INDEX_ENTRY_RE.match(line)
            if m:
                entries.append({"kind": "offset", "offset": int(m.group(1)),
                                "position": int(m.group(2)), "file": file})
                continue
            m = _TIME_INDEX_ENTRY_RE.match(line)
            if m:
                entries.append({"kind": "time", "timestamp": int(m.group(1)),
                                "offset": int(m.group(2)), "file": file})
    return entries


# Messages DumpLogSegments (4.x) prints for index / log problems. Verification
# (no --index-sanity-check), on stderr, after all files are dumped:
#   "Mismatches in :<abs .index path>" + "  Index offset: N, log offset: M"
#       (.index entry offset != lastOffset of the batch at that position)
#   "Found timestamp mismatch in :<abs .timeindex path>" + "  Index timestamp: T, log timestamp: L"
#   "Found out of order timestamp in :<path>" + "  Index timestamp: T, Previously indexed timestamp: P"
#   "The following indexed offsets are not found in :<path>" (4.3; trunk: "... in the log.")
#       + "Indexed offset: N, found log offset: M"
#   "Non-consecutive offsets in <abs .log path>" + "  A is followed by B"  (deep iteration)
#   "Found N invalid bytes at the end of <name>.log"                      (stdout)
# --index-sanity-check failures throw (exit 1, message + stack trace on stderr):
#   "Corrupt index found, index file <f> has non-zero size but the last offset is N which is less than the base offset B"
#   "Index file <f> is corrupt, found N bytes which is neither positive nor a multiple of 8"
#   "Corrupt time index found, time index file (<f>) has non-zero size but the last timestamp is T which is less than the first timestamp F"
#   "Corrupt time index found, time index file (<f>) has non-zero size but the last offset is N which is less than the first offset B"
#   "Time index file <f> is corrupt, found N bytes which is neither positive nor a multiple of 12"
_INDEX_ERROR_HEADERS = (
    "Mismatches in :",
    "Found timestamp mismatch in :",
    "Found out of order timestamp in :",
    "The following indexed offsets are not found in",
    "Non-consecutive offsets in ",
)
_INDEX_ERROR_DETAILS = (
    re.compile(r"^\s*Index offset: -?\d+, log offset: -?\d+$"),
    re.compile(r"^\s*Index timestamp: -?\d+, log timestamp: -?\d+$"),
    re.compile(r"^\s*Index timestamp: -?\d+, Previously indexed timestamp: -?\d+$"),
    re.compile(r"^\s*Indexed offset: -?\d+, found log offset: -?\d+$"),
    re.compile(r"^\s*-?\d+ is followed by -?\d+$"),
)
_INDEX_ERROR_ANYWHERE = (
    re.compile(r"Corrupt (?:time )?index found"),
    re.compile(r"(?:Time index|Index) file \S+ is corrupt"),
    re.compile(r"Found \d+ invalid bytes at the end of"),
    re.compile(r"CorruptIndexException|CorruptRecordException|InvalidRecordException"),
)


def dump_reports_index_errors(text: str) -> list[str]:
    """Lines of DumpLogSegments output reporting index/log inconsistencies (empty = clean).

    Covers the verification reports (index offset / timestamp mismatches,
    out-of-order timestamps, indexed offsets not found, non-consecutive record
    offsets), trailing invalid bytes in a .log, batches printed with
    ``isvalid: false`` (bad CRC), and sanity-check/corruption exceptions
    (reported once even when the tool prints both the message and the trace).
    Stack-trace "at ..." lines are not included.
    """
    errors: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.lstrip().startswith("at "):
            continue
        if line.startswith(_INDEX_ERROR_HEADERS) or any(p.match(line) for p in _INDEX_ERROR_DETAILS):
            errors.append(line)
        elif _BATCH_LINE_RE.match(line):
            if line.endswith(" isvalid: false"):
                errors.append(line)
        elif any(p.search(line) for p in _INDEX_ERROR_ANYWHERE):
            # mainNoExit-style tools print getMessage() and then the trace's
            # "Exception: message" line: keep one of them.
            if not any(line.endswith(e) or e.endswith(line) for e in errors):
                errors.append(line)
    return errors
