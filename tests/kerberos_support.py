"""A real MIT Kerberos KDC for tests (Debian's krb5-kdc and krb5-user): ``Kdc.start(directory)``
makes a realm of its own in ``directory`` (``kdb5_util create``), writes a ``krb5.conf`` naming
the KDC on a free loopback port, and runs ``krb5kdc`` in the foreground until ``stop()``.
``add_principal`` creates a principal with a random key and ``keytab`` exports its key to a
keytab file (each export after the first gives the principal a new key, making older keytabs
stale, as ``kadmin ktadd`` does). Clients and the broker find the KDC through the ``krb5.conf``:
``env`` holds ``KRB5_CONFIG`` for child processes, ``java_opts`` Java's system property.

When the KDC's programs are missing this raises (never skips): ``make system-deps`` installs them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from broker_process import free_port, stop_process
from support.waiting import eventually

REALM = "STRATA.TEST"
MASTER_PASSWORD = "strata-kdc-master"


def _require(*programs: str) -> dict[str, str]:
    found = {p: shutil.which(p) or shutil.which(p, path="/usr/sbin:/sbin") for p in programs}
    missing = [p for p, path in found.items() if path is None]
    if missing:
        raise RuntimeError(f"MIT Kerberos programs missing: {', '.join(missing)} (Debian's "
                           f"krb5-kdc, krb5-admin-server and krb5-user; `make system-deps`)")
    return found  # type: ignore[return-value]


@dataclass
class Kdc:
    directory: Path
    port: int
    realm: str = REALM
    proc: subprocess.Popen | None = None
    _programs: dict[str, str] = field(default_factory=dict)

    @property
    def krb5_conf(self) -> Path:
        return self.directory / "krb5.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a child process that uses this realm (KDC tools and clients)."""
        return {**os.environ, "KRB5_CONFIG": str(self.krb5_conf),
                "KRB5_KDC_PROFILE": str(self.directory / "kdc.conf"),
                "KRB5CCNAME": f"FILE:{self.directory / 'default.ccache'}"}

    @property
    def java_opts(self) -> list[str]:
        return [f"-Djava.security.krb5.conf={self.krb5_conf}"]

    @classmethod
    def start(cls, directory: Path) -> "Kdc":
        directory.mkdir(parents=True, exist_ok=True)
        kdc = cls(directory, free_port())
        kdc._programs = _require("krb5kdc", "kdb5_util", "kadmin.local", "kinit")
        kdc._write_config()
        kdc._run("kdb5_util", "create", "-s", "-r", kdc.realm, "-P", MASTER_PASSWORD)
        kdc.proc = subprocess.Popen([kdc._programs["krb5kdc"], "-n", "-r", kdc.realm],
                                    env=kdc.env, stdout=subprocess.DEVNULL,
                                    stderr=open(directory / "krb5kdc.err", "wb"))

        def listening() -> bool:
            if kdc.proc.poll() is not None:
                raise RuntimeError(f"krb5kdc exited {kdc.proc.returncode}: "
                                   f"{(directory / 'krb5kdc.err').read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", kdc.port), timeout=0.5):
                    return True
            except OSError:
                return False
        eventually(listening, f"krb5kdc listening on {kdc.port}", timeout=30)
        return kdc

    def _write_config(self) -> None:
        d = self.directory
        (d / "kdc.conf").write_text(f"""\
[kdcdefaults]
    kdc_ports = {self.port}
    kdc_tcp_ports = {self.port}
[realms]
    {self.realm} = {{
        database_name = {d}/principal
        key_stash_file = {d}/stash
        acl_file = {d}/kadm5.acl
        max_life = 1h
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}
[logging]
    kdc = FILE:{d}/kdc.log
""")
        (d / "kadm5.acl").write_text("")
        # no DNS: host-based service names keep the host the client was given (localhost)
        self.krb5_conf.write_text(f"""\
[libdefaults]
    default_realm = {self.realm}
    dns_lookup_realm = false
    dns_lookup_kdc = false
    dns_canonicalize_hostname = false
    rdns = false
    udp_preference_limit = 1
    ticket_lifetime = 1h
[realms]
    {self.realm} = {{
        kdc = 127.0.0.1:{self.port}
    }}
[domain_realm]
    localhost = {self.realm}
    .localhost = {self.realm}
""")

    def _run(self, program: str, *args: str) -> str:
        result = subprocess.run([self._programs.get(program) or program, *args], env=self.env,
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} exited {result.returncode}: "
                               f"{result.stdout}{result.stderr}")
        return result.stdout

    def kadmin(self, query: str) -> str:
        return self._run("kadmin.local", "-r", self.realm, "-q", query)

    def principal(self, name: str) -> str:
        return name if "@" in name else f"{name}@{self.realm}"

    def add_principal(self, name: str) -> str:
        principal = self.principal(name)
        self.kadmin(f"addprinc -randkey {principal}")
        return principal

    def keytab(self, name: str, path: Path | None = None) -> Path:
        """A new key for ``name`` exported to a keytab (``<name>.keytab`` in the directory)."""
        principal = self.principal(name)
        path = path or self.directory / (principal.split("@")[0].replace("/", "_") + ".keytab")
        self.kadmin(f"ktadd -k {path} {principal}")
        return path

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
