"""``strata storage format --add-scram``: Kafka's argument syntax and refusals, and credentials
written to a single broker's metadata where the SCRAM server finds them."""

from __future__ import annotations

import base64

import pytest
import scramp

from strata.cli.main import main
from strata.cli.storage_format import FormatError, parse_add_scram
from strata.cluster.metadata import ClusterMetadata
from strata.security.scram import MECHANISMS, ScramFormatter, ScramServer


def test_a_password_argument_makes_a_salted_credential_with_kafkas_defaults():
    arg = parse_add_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]")
    assert (arg.user, arg.mechanism, arg.iterations) == ("alice", "SCRAM-SHA-256", 4096)
    formatter = ScramFormatter(MECHANISMS["SCRAM-SHA-256"])
    assert arg.salted_password == formatter.salted_password("alice-secret", arg.salt, 4096)
    quoted = parse_add_scram('SCRAM-SHA-512=[name="bob",password="pw"]')   # quotes dropped
    assert (quoted.user, quoted.mechanism) == ("bob", "SCRAM-SHA-512")


def test_salt_and_salted_password_are_taken_as_given():
    salt, salted = b"0123456789abcdef", b"s" * 32
    arg = parse_add_scram(f"SCRAM-SHA-256=[name=carol,iterations=8192,"
                          f"salt={base64.b64encode(salt).decode()},"
                          f"saltedpassword={base64.b64encode(salted).decode()}]")
    assert (arg.salt, arg.salted_password, arg.iterations) == (salt, salted, 8192)


@pytest.mark.parametrize("argument, message", [
    ("SCRAM-SHA-256", "Failed to find equals sign in SCRAM argument"),
    ("SCRAM-SHA-1=[name=a,password=b]", "The add-scram mechanism SCRAM-SHA-1 is not supported."),
    ("SCRAM-SHA-256=name=a,password=b]", "Expected configuration string to start with ["),
    ("SCRAM-SHA-256=[name=a,password=b", "Expected configuration string to end with ]"),
    ("SCRAM-SHA-256=[password=b]", "You must supply 'name' to add-scram"),
    ("SCRAM-SHA-256=[name=a]", "You must supply one of 'password' or 'saltedpassword'"),
    ("SCRAM-SHA-256=[name=a,saltedpassword=YQ==]", "You must supply 'salt' with 'saltedpassword'"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=100]", "must be >= 4096"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=20000]", "must be <= 16384"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=x]", "Failed to parse iterations count: x"),
    ("SCRAM-SHA-256=[name=a,password=b,colour=red]", "Unknown SCRAM configurations: colour"),
    ("SCRAM-SHA-256=[name=a,password]", "No equals sign found in SCRAM component: password"),
    ("SCRAM-SHA-256=[name=a,salt=%%%,saltedpassword=YQ==]", "Failed to decode given salt"),
])
def test_kafkas_refusals(argument, message):
    with pytest.raises(FormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_add_scram(argument)


def test_format_stores_credentials_a_broker_on_that_log_dir_authenticates(tmp_path, capsys):
    logs = tmp_path / "logs"
    assert main(["storage", "format", "--override", f"log.dirs={logs}", "--override", "node.id=3",
                 "--add-scram", "SCRAM-SHA-256=[name=alice,password=alice-secret]",
                 "--add-scram", "SCRAM-SHA-512=[name=alice,password=alice-secret,iterations=8192]"
                 ]) == 0
    assert "SCRAM credentials of alice" in capsys.readouterr().out
    metadata = ClusterMetadata(logs, 3, {})
    try:
        assert metadata.scram_credential("alice", "SCRAM-SHA-512").iterations == 8192
        server = ScramServer(MECHANISMS["SCRAM-SHA-256"], metadata.scram_credential)
        client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
        client.set_server_first(server.evaluate(client.get_client_first().encode()).decode())
        client.set_server_final(server.evaluate(client.get_client_final().encode()).decode())
        assert server.complete and str(server.principal) == "User:alice"
    finally:
        metadata.close()


def test_a_refused_argument_exits_with_kafkas_message_and_writes_nothing(tmp_path):
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit, match="Error while formatting: You must supply 'name'"):
        main(["storage", "format", "--override", f"log.dirs={logs}",
              "--add-scram", "SCRAM-SHA-256=[password=x]"])
    assert not logs.exists()
