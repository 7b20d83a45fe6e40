"""SCRAM as Kafka does it: the formatter against RFC 7677's example (Kafka's ScramFormatterTest)
and scramp's independent computation, Kafka's credential string, user name sanitizing, and the
broker's side of the exchange against scramp's client and a hand-rolled one: wrong passwords,
unknown users (answered like wrong passwords, with a stable made-up salt), nonces replayed or
changed, channel binding, authorization ids, tokenauth, garbage."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import scramp

from strata.security.sasl import (
    MECHANISMS as SASL_MECHANISMS, KafkaPrincipal, SaslAuthenticationFailed, SaslConfigError,
    server_factories)
from strata.security.scram import (
    SCRAM_SHA_256, SCRAM_SHA_512, ScramCredential, ScramFormatter, ScramServer,
    credential_from_string, credential_to_string, desanitize, fake_credential, random_salt,
    sanitize, user_credentials)

# RFC 7677 section 3 (the example Kafka's ScramFormatterTest checks)
RFC_C1 = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_S1 = ("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,"
          "i=4096")
RFC_C2 = ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
          "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_S2 = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")

INVALID = "Authentication failed during authentication due to invalid credentials with SASL " \
          "mechanism {}"


class Store:
    """The ScramCredentials protocol over a dict."""

    def __init__(self, credentials: dict[tuple[str, str], ScramCredential] | None = None):
        self.credentials = dict(credentials or {})
        self.asked: list[tuple[str, str]] = []

    def scram_credential(self, user, mechanism):
        self.asked.append((user, mechanism))
        return self.credentials.get((user, mechanism))


def store_with(user: str, password: str, mechanism=SCRAM_SHA_256, iterations=4096,
               salt: bytes | None = None) -> Store:
    cred = ScramFormatter(mechanism).generate_credential(password, iterations, salt)
    return Store({(user, mechanism.name): cred})


# ---- the formatter -----------------------------------------------------------------------------

def test_formatter_matches_rfc_7677s_example():
    # the server's side of RFC 7677's exchange from a credential made from the password only
    cred = ScramFormatter(SCRAM_SHA_256).generate_credential("pencil", 4096, RFC_SALT)
    server = ScramServer(SCRAM_SHA_256, Store({("user", "SCRAM-SHA-256"): cred}).scram_credential,
                         server_nonce=lambda: RFC_SERVER_NONCE)
    assert server.evaluate(RFC_C1.encode()).decode() == RFC_S1
    assert server.evaluate(RFC_C2.encode()).decode() == RFC_S2
    assert server.complete and server.principal == KafkaPrincipal("User", "user")


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_formatter_keys_match_scramps_and_the_rfc_definitions(mechanism):
    salt = b"0123456789abcdef"
    fmt = ScramFormatter(mechanism)
    cred = fmt.generate_credential("pencil", 4096, salt)
    assert (cred.salt, cred.stored_key, cred.server_key, cred.iterations) == \
        scramp.ScramMechanism(mechanism.name).make_auth_info("pencil", 4096, salt)
    # by the RFC's definitions, written out with hmac/hashlib only
    h = mechanism.hash_name
    salted = hashlib.pbkdf2_hmac(h, b"pencil", salt, 4096)
    assert cred.stored_key == hashlib.new(h, hmac.new(salted, b"Client Key", h).digest()).digest()
    assert cred.server_key == hmac.new(salted, b"Server Key", h).digest()
    # an upsertion carries the salted password: the same credential
    assert fmt.credential(salt, fmt.salted_password("pencil", salt, 4096), 4096) == cred


def test_kafka_credential_string_round_trips_and_refuses_bad_forms():
    cred = ScramCredential(b"salt", b"\x01\x02", b"\x03", 4096)
    text = credential_to_string(cred)
    assert text == "salt=c2FsdA==,stored_key=AQI=,server_key=Aw==,iterations=4096"
    assert credential_from_string(text) == cred and str(cred) == text
    assert "stored_key" not in repr(cred)  # keys never logged
    for bad in ("", "salt=c2FsdA==", text + ",extra=1", "salt=c2FsdA==,stored_key=AQI=,"
                "server_key=Aw==,iterations=x", "=x,salt=c2FsdA==,stored_key=AQI=,"
                "server_key=Aw==", "salt=!!!!,stored_key=AQI=,server_key=Aw==,iterations=4096"):
        with pytest.raises(ValueError):
            credential_from_string(bad)
    # quotas beside credentials in a user's entity config are left out, bad values too
    assert user_credentials({"SCRAM-SHA-256": text, "producer_byte_rate": "1024",
                             "SCRAM-SHA-512": "garbage"}) == {"SCRAM-SHA-256": cred}


def test_random_salt_is_kafkas_base36_form():
    salts = {random_salt() for _ in range(50)}
    assert len(salts) == 50
    assert all(s.isalnum() and s == s.lower() and 20 <= len(s) <= 26 for s in salts)


def test_user_names_sanitize_as_kafkas_sanitizer():
    # Java's URLEncoder, then * and space percent-encoded
    assert sanitize("alice") == "alice"
    assert sanitize("user3@user3.com") == "user3%40user3.com"
    assert sanitize("a b*c~d/é") == "a%20b%2Ac%7Ed%2F%C3%A9"
    assert sanitize("<default>") == "%3Cdefault%3E"
    for name in ("alice", "a b*c~d/é", "x+y", "CN=a,O=b"):
        assert desanitize(sanitize(name)) == name


# ---- the exchange ------------------------------------------------------------------------------

def exchange(server: ScramServer, client: scramp.ScramClient) -> bytes:
    first = server.evaluate(client.get_client_first().encode())
    client.set_server_first(first.decode())
    final = server.evaluate(client.get_client_final().encode())
    client.set_server_final(final.decode())   # checks the server's signature
    return final


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
@pytest.mark.parametrize("iterations", [4096, 8192])
def test_scramp_client_authenticates(mechanism, iterations):
    store = store_with("alice", "alice-secret", mechanism, iterations)
    server = ScramServer(mechanism, store.scram_credential)
    assert server.mechanism == mechanism.name and not server.complete
    exchange(server, scramp.ScramClient([mechanism.name], "alice", "alice-secret"))
    assert server.complete and server.principal == KafkaPrincipal("User", "alice")
    assert store.asked == [("alice", mechanism.name)]
    with pytest.raises(SaslAuthenticationFailed, match="Unexpected challenge"):
        server.evaluate(b"n,,n=alice,r=again")


def test_user_names_with_comma_and_equals_travel_escaped():
    store = store_with("CN=a,O=b", "pw")
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    exchange(server, scramp.ScramClient(["SCRAM-SHA-256"], "CN=a,O=b", "pw"))
    assert server.principal == KafkaPrincipal("User", "CN=a,O=b")


def test_a_salt_shorter_than_scramps_minimum_is_served():
    # AlterUserScramCredentials takes any salt the client sends (Kafka's own tests send "salt")
    store = store_with("alice", "pw", salt=b"salt")
    client = RawClient("alice", "pw")
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    client.run(server)
    assert server.complete


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_wrong_password_fails_at_the_final_message(mechanism):
    store = store_with("alice", "alice-secret", mechanism)
    server = ScramServer(mechanism, store.scram_credential)
    with pytest.raises(SaslAuthenticationFailed) as failed:
        exchange(server, scramp.ScramClient([mechanism.name], "alice", "wrong"))
    assert str(failed.value) == INVALID.format(mechanism.name)
    assert not server.complete and server.principal is None
    with pytest.raises(SaslAuthenticationFailed, match="Unexpected challenge in Sasl server "
                                                       "state FAILED"):
        server.evaluate(b"c=biws,r=x,p=AAAA")


def test_unknown_user_is_answered_like_a_wrong_password():
    store = store_with("alice", "alice-secret")
    salts = set()
    for _ in range(3):
        server = ScramServer(SCRAM_SHA_256, store.scram_credential)
        client = scramp.ScramClient(["SCRAM-SHA-256"], "mallory", "guess")
        first = server.evaluate(client.get_client_first().encode()).decode()
        fields = dict(f.split("=", 1) for f in first.split(","))
        assert fields["i"] == "4096"
        salts.add(fields["s"])
        client.set_server_first(first)
        with pytest.raises(SaslAuthenticationFailed) as failed:
            server.evaluate(client.get_client_final().encode())
        assert str(failed.value) == INVALID.format("SCRAM-SHA-256")
    assert len(salts) == 1   # the same made-up salt every time: nothing changes to tell
    fake = base64.b64decode(salts.pop())   # in the form of a real (Kafka-made) salt
    assert fake.isalnum() and fake == fake.lower() and 20 <= len(fake) <= 26
    assert fake_credential(SCRAM_SHA_256, "x").salt != fake_credential(SCRAM_SHA_256, "y").salt


class RawClient:
    """A hand-rolled SCRAM client (RFC 5802) that can misbehave."""

    def __init__(self, user, password, mechanism=SCRAM_SHA_256, nonce="fyko+d2lbbFgONRv9qkxdawL",
                 gs2="n,,"):
        self.user, self.password, self.mech = user, password, mechanism
        self.nonce, self.gs2 = nonce, gs2

    def first(self) -> bytes:
        self.bare = f"n={self.user},r={self.nonce}"
        return (self.gs2 + self.bare).encode()

    def final(self, server_first: bytes, nonce: str | None = None, channel: str | None = None,
              proof: bytes | None = None) -> bytes:
        s1 = server_first.decode()
        fields = dict(f.split("=", 1) for f in s1.split(","))
        nonce = fields["r"] if nonce is None else nonce
        channel = base64.b64encode(self.gs2.encode()).decode() if channel is None else channel
        without_proof = f"c={channel},r={nonce}"
        fmt = ScramFormatter(self.mech)
        salted = fmt.salted_password(self.password, base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = fmt.client_key(salted)
        auth = f"{self.bare},{s1},{without_proof}".encode()
        signature = fmt.hmac(fmt.stored_key(client_key), auth)
        if proof is None:
            proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self.expected = fmt.hmac(fmt.server_key(salted), auth)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def run(self, server, **final_args) -> bytes:
        answer = server.evaluate(self.final(server.evaluate(self.first()), **final_args))
        assert answer == b"v=" + base64.b64encode(self.expected)
        return answer


def test_hand_rolled_client_authenticates():
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    RawClient("alice", "pw").run(server)
    assert server.complete


@pytest.mark.parametrize("change", [
    "server part changed", "client part changed", "server part missing", "appended"])
def test_a_modified_nonce_fails(change):
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    client = RawClient("alice", "pw")
    first = server.evaluate(client.first())
    nonce = dict(f.split("=", 1) for f in first.decode().split(","))["r"]
    bad = {"server part changed": nonce[:-1] + ("x" if nonce[-1] != "x" else "y"),
           "client part changed": "X" + nonce[1:],
           "server part missing": client.nonce,
           "appended": nonce + "x"}[change]
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(client.final(first, nonce=bad))
    assert not server.complete


def test_a_final_nonce_ending_with_the_whole_nonce_passes_as_kafkas_endswith():
    """librdkafka 2.0.x (Debian's kcat) sends its own part of the nonce twice; Kafka accepts it."""
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    client = RawClient("alice", "pw")
    first = server.evaluate(client.first())
    nonce = dict(f.split("=", 1) for f in first.decode().split(","))["r"]
    server.evaluate(client.final(first, nonce=client.nonce + nonce))
    assert server.complete


def test_a_replayed_final_message_fails_on_a_new_exchange():
    store = store_with("alice", "pw")
    client = RawClient("alice", "pw")
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    first = server.evaluate(client.first())
    final = client.final(first)
    server.evaluate(final)
    assert server.complete
    # the same client messages again: a new server nonce, so the old final message fails
    again = ScramServer(SCRAM_SHA_256, store.scram_credential)
    assert again.evaluate(client.first()) != first
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        again.evaluate(final)


@pytest.mark.parametrize("channel", ["", "eSws", base64.b64encode(b"n,a=alice,").decode(),
                                     base64.b64encode(b"p=tls-unique,,xyz").decode()])
def test_channel_binding_must_echo_the_header(channel):
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    client = RawClient("alice", "pw")
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(client.final(server.evaluate(client.first()), channel=channel))


@pytest.mark.parametrize("gs2", ["y,,", "p=tls-unique,,", "p=tls-server-end-point,,"])
def test_only_channel_binding_n_is_accepted(gs2):
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(RawClient("alice", "pw", gs2=gs2).first())


def test_authorization_id_must_be_the_user():
    store = store_with("alice", "pw")
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    RawClient("alice", "pw", gs2="n,a=alice,").run(server)
    assert server.principal == KafkaPrincipal("User", "alice")
    for user in ("alice", "nobody"):   # the same answer whether or not the user exists
        server = ScramServer(SCRAM_SHA_256, store.scram_credential)
        with pytest.raises(SaslAuthenticationFailed) as failed:
            server.evaluate(RawClient(user, "pw", gs2="n,a=bob,").first())
        assert str(failed.value) == ("Authentication failed: Client requested an authorization "
                                     "id that is different from username")


def test_tokenauth_is_refused_and_other_extensions_ignored():
    store = store_with("alice", "pw")
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(b"n,,n=alice,r=abc,tokenauth=true")
    client = RawClient("alice", "pw", nonce="abc,foo=bar")   # an extension after the nonce
    server = ScramServer(SCRAM_SHA_256, store.scram_credential)
    client.run(server)
    assert server.complete


@pytest.mark.parametrize("token", [
    b"", b"n,,", b"n,,n=alice", b"n,,r=abc,n=alice", b"x,,n=alice,r=abc", b"n,,n=,r=abc",
    b"n,,n=a=b,r=abc", b"n,,n=alice,r=a,b", b"\xff\xfe", b"n,,n=al\x00ice,r=abc",
    "n,,n=j\u00f6rg,r=abc".encode()])
def test_garbage_first_messages_fail_cleanly(token):
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(token)


@pytest.mark.parametrize("final", [b"", b"c=biws", b"c=biws,r=x", b"c=!!,r=x,p=AAAA",
                                   b"c=biws,r=x,p=AAAA,extra", b"\xff"])
def test_garbage_final_messages_fail_cleanly(final):
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    server.evaluate(b"n,,n=alice,r=abc")
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(final)


def test_a_proof_of_the_wrong_length_fails():
    server = ScramServer(SCRAM_SHA_256, store_with("alice", "pw").scram_credential)
    client = RawClient("alice", "pw")
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(client.final(server.evaluate(client.first()), proof=b"\0" * 64))


def test_stored_iterations_below_the_minimum_fail():
    cred = ScramFormatter(SCRAM_SHA_256).generate_credential("pw", 1024)
    server = ScramServer(SCRAM_SHA_256, Store({("alice", "SCRAM-SHA-256"): cred}).scram_credential)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(RawClient("alice", "pw").first())


def test_a_failing_credential_store_fails_the_exchange_only():
    def broken(user, mechanism):
        raise RuntimeError("ZooKeeper down")
    server = ScramServer(SCRAM_SHA_256, broken)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        server.evaluate(b"n,,n=alice,r=abc")


# ---- the registry ------------------------------------------------------------------------------

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" ' \
       'password="admin-secret";'


def test_scram_mechanisms_are_registered_and_need_jaas_and_a_store():
    assert {"SCRAM-SHA-256", "SCRAM-SHA-512"} <= set(SASL_MECHANISMS)
    props = {"sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
             "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": JAAS,
             "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": JAAS}
    store = store_with("alice", "pw", SCRAM_SHA_512)
    factories = server_factories(props, "SASL_PLAINTEXT", store)
    assert sorted(factories) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    server = factories["SCRAM-SHA-512"]()
    assert server.mechanism == "SCRAM-SHA-512"
    exchange(server, scramp.ScramClient(["SCRAM-SHA-512"], "alice", "pw"))
    assert server.principal == KafkaPrincipal("User", "alice")
    with pytest.raises(SaslConfigError, match="credential store"):
        server_factories(props, "SASL_PLAINTEXT", None)
    with pytest.raises(SaslConfigError, match="scram-sha-256.sasl.jaas.config"):
        server_factories({"sasl.enabled.mechanisms": "SCRAM-SHA-256"}, "SASL_PLAINTEXT", store)
