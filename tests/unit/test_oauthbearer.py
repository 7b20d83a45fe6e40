"""SASL/OAUTHBEARER on the broker's side (``strata.security.oauthbearer``): signed JWTs against a
JWKS file (RS256, ES256; expiry, audience, issuer, signature, key id, alg none, garbage, sub),
Kafka's unsecured tokens, the client message's format, the JSON challenge and its failure, and
Kafka 4's URL allow-list."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from support.waiting import eventually
from strata.security.oauthbearer import (
    ALLOWED_URLS, InvalidToken, JwksKeys, JwksValidator, OAuthBearerServer, UnsecuredValidator,
    allowed_urls, mechanism_prop, parse_initial_response)
from strata.security.sasl import KafkaPrincipal, SaslAuthenticationFailed, SaslConfigError, \
    server_factories

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;"


def jwk(key, kid: str) -> dict:
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) \
        else jwt.algorithms.ECAlgorithm
    return {**json.loads(algorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig"}


@pytest.fixture
def jwks_file(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk(RSA_KEY, "rsa-1"), jwk(EC_KEY, "ec-1")]}))
    return path


def sign(claims: dict | None = None, key=RSA_KEY, alg="RS256", kid="rsa-1", **extra) -> str:
    now = int(time.time())
    body = {"sub": "alice", "iat": now, "exp": now + 300, "aud": "kafka", "iss": "https://idp",
            **(claims or {})}
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid, **extra})


def validator(jwks_file, **kwargs) -> JwksValidator:
    return JwksValidator(JwksKeys(jwks_file.as_uri()), **{"audience": ["kafka"],
                                                          "issuer": "https://idp", **kwargs})


def message(token: str, authzid: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()


def test_rs256_and_es256_tokens_from_a_jwks_file_name_their_subject(jwks_file):
    v = validator(jwks_file)
    token = v.validate(sign({"scope": "read write"}))
    assert token.principal == "alice" and token.scopes == {"read", "write"}
    assert token.expires_ms > time.time() * 1000
    assert v.validate(sign({"sub": "bob"}, key=EC_KEY, alg="ES256", kid="ec-1")).principal == "bob"


@pytest.mark.parametrize("token, why", [
    (lambda: sign({"exp": int(time.time()) - 120}), "expired"),
    (lambda: sign({"iat": int(time.time()) + 600, "exp": int(time.time()) + 900}), "not yet valid"),
    (lambda: sign({"nbf": int(time.time()) + 600}), "not yet valid"),
    (lambda: sign({"aud": "other"}), "wrong audience"),
    (lambda: sign({"aud": None}), "no audience"),
    (lambda: sign({"iss": "https://evil"}), "wrong issuer"),
    (lambda: sign(key=OTHER_KEY), "wrong signature"),
    (lambda: sign(kid="nobody"), "unknown kid"),
    (lambda: sign(key=EC_KEY, alg="ES256", kid="rsa-1"), "key of another type"),
    (lambda: jwt.encode({"sub": "alice", "iat": 1, "exp": 2**40, "aud": "kafka",
                         "iss": "https://idp"}, None, algorithm="none"), "alg none"),
    (lambda: jwt.encode({"sub": "alice", "iat": int(time.time()), "exp": 2**40, "aud": "kafka",
                         "iss": "https://idp"}, "secret" * 8, algorithm="HS256",
                        headers={"kid": "rsa-1"}), "symmetric alg"),
    (lambda: sign({"sub": None}), "missing sub"),
    (lambda: sign({"sub": "  "}), "blank sub"),
    (lambda: sign({"exp": None}), "no exp"),
    (lambda: sign({"iat": None}), "no iat"),
    (lambda: "not.a.jwt", "garbage"),
    (lambda: "eyJhbGciOiJSUzI1NiJ9", "one part"),
    (lambda: sign()[:-4] + "AAAA", "truncated signature"),
])
def test_tokens_kafka_refuses_are_refused(jwks_file, token, why):
    with pytest.raises(InvalidToken):
        validator(jwks_file).validate(token())


def test_the_clock_skew_and_claim_names_are_configurable(jwks_file):
    late = sign({"exp": int(time.time()) - 20})
    assert validator(jwks_file, clock_skew_s=60).validate(late).principal == "alice"
    with pytest.raises(InvalidToken):
        validator(jwks_file, clock_skew_s=0).validate(late)
    v = validator(jwks_file, sub_claim="client_id", scope_claim="scp")
    assert v.validate(sign({"client_id": "svc", "scp": ["a", "b"]})).principal == "svc"
    assert v.validate(sign({"client_id": "svc", "scp": ["a", "b"]})).scopes == {"a", "b"}


def test_a_changed_jwks_file_is_read_again(jwks_file):
    v = validator(jwks_file)
    with pytest.raises(InvalidToken):
        v.validate(sign(key=OTHER_KEY, kid="rotated"))
    jwks_file.write_text(json.dumps({"keys": [jwk(OTHER_KEY, "rotated")]}))
    import os
    os.utime(jwks_file, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert v.validate(sign(key=OTHER_KEY, kid="rotated")).principal == "alice"


def test_a_jwks_url_is_fetched_and_an_unknown_kid_brings_a_refresh():
    served = {"keys": [jwk(RSA_KEY, "rsa-1")]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(served).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    keys = JwksKeys(f"http://127.0.0.1:{httpd.server_port}/jwks")
    try:
        v = JwksValidator(keys, ["kafka"], "https://idp")
        assert v.validate(sign()).principal == "alice"
        served["keys"].append(jwk(OTHER_KEY, "new"))
        eventually(lambda: v.validate(sign(key=OTHER_KEY, kid="new")).principal == "alice",
                   "the new key fetched after an unknown kid", ignoring=InvalidToken)
    finally:
        keys.close()
        httpd.shutdown()


def unsecured(claims: dict, alg: str = "none", signature: str = "") -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': alg})}.{part(claims)}.{signature}"


def test_unsecured_tokens_as_kafkas_default_validator_checks_them():
    now = time.time()
    v = UnsecuredValidator({"unsecuredValidatorRequiredScope": "kafka",
                            "unsecuredValidatorAllowableClockSkewMs": "5000"}, clock=lambda: now)
    assert v.validate(unsecured({"sub": "alice", "exp": now + 60, "scope": "kafka x"})
                      ).principal == "alice"
    assert v.validate(unsecured({"sub": "a", "exp": now - 2, "scope": ["kafka"]})).principal == "a"
    for bad in (unsecured({"sub": "alice", "exp": now + 60}),                       # no scope
                unsecured({"sub": "alice", "exp": now - 10, "scope": "kafka"}),      # expired
                unsecured({"exp": now + 60, "scope": "kafka"}),                      # no sub
                unsecured({"sub": "alice", "scope": "kafka"}),                       # no exp
                unsecured({"sub": "a", "iat": now + 60, "exp": now + 90, "scope": "kafka"}),
                unsecured({"sub": "a", "exp": now + 60, "scope": "kafka"}, alg="RS256"),
                unsecured({"sub": "a", "exp": now + 60, "scope": "kafka"}, signature="c2ln"),
                "a.b", "!!!.???.", unsecured({"sub": "a"}).replace(".", "..", 1)):
        with pytest.raises(InvalidToken):
            v.validate(bad)
    with pytest.raises(InvalidToken) as missing:
        v.validate(unsecured({"sub": "alice", "exp": now + 60, "scope": "other"}))
    assert missing.value.scope == "['kafka']"
    with pytest.raises(SaslConfigError):
        UnsecuredValidator({"unsecuredValidatorAllowableClockSkewMs": "-1"})


def test_the_client_message_is_parsed_as_kafkas_initial_response():
    assert parse_initial_response(b"n,,\x01auth=Bearer abc.def.\x01\x01") == ("abc.def.", "")
    assert parse_initial_response(b"n,a=alice,\x01auth=bearer t0k\x01ext=v al\x01\x01") \
        == ("t0k", "alice")
    for bad in (b"", b"n,,\x01\x01", b"n,,\x01auth=Basic abc\x01\x01", b"y,,\x01auth=Bearer a\x01\x01",
                b"n,,\x01auth=Bearer a b\x01\x01", b"n,,\x01auth=Bearer a\x01", b"\xff\xfe",
                b"n,,\x01auth=Bearer a\x01bad-key=v\x01\x01", b"n,a=x,y,\x01auth=Bearer a\x01\x01"):
        with pytest.raises(SaslAuthenticationFailed):
            parse_initial_response(bad)


def test_an_invalid_token_gets_the_json_challenge_then_fails_with_it(jwks_file):
    v = validator(jwks_file)
    server = OAuthBearerServer(v.validate)
    assert server.evaluate(message(sign(key=OTHER_KEY))) == b'{"status":"invalid_token"}'
    assert not server.complete
    with pytest.raises(SaslAuthenticationFailed, match='invalid_token'):
        server.evaluate(b"\x01")
    server = OAuthBearerServer(v.validate)
    with pytest.raises(SaslAuthenticationFailed):
        server.evaluate(b"\x01")     # no challenge sent: not a client's answer to one
    token = sign()
    assert server.evaluate(message(token)) == b""
    assert server.complete and server.principal == KafkaPrincipal("User", "alice")
    assert server.credential_expires_ms == jwt.decode(token, options={"verify_signature": False}
                                                      )["exp"] * 1000
    with pytest.raises(SaslAuthenticationFailed, match="authorization id"):
        OAuthBearerServer(v.validate).evaluate(message(sign(), authzid="bob"))


def test_listener_settings_and_the_url_allow_list(jwks_file):
    url = jwks_file.as_uri()
    props = {"sasl.enabled.mechanisms": "OAUTHBEARER",
             "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": JAAS,
             "listener.name.sasl_ssl.oauthbearer.sasl.oauthbearer.jwks.endpoint.url": url,
             "listener.name.sasl_ssl.sasl.oauthbearer.expected.audience": "kafka",
             "sasl.oauthbearer.expected.issuer": "https://idp"}
    assert mechanism_prop(props, "SASL_SSL", "sasl.oauthbearer.jwks.endpoint.url") == url
    assert mechanism_prop(props, "SASL_SSL", "sasl.oauthbearer.expected.audience") == "kafka"
    assert mechanism_prop(props, "OTHER", "sasl.oauthbearer.expected.issuer") == "https://idp"
    with pytest.raises(SaslConfigError, match=ALLOWED_URLS):
        server_factories(props, "SASL_SSL")   # Kafka 4: no URL is allowed unless listed
    make = server_factories({**props, ALLOWED_URLS: f"https://x,{url}"}, "SASL_SSL")["OAUTHBEARER"]
    assert make().evaluate(message(sign())) == b""
    assert make().evaluate(message(sign({"aud": "x"}))).startswith(b'{"status"')
    assert allowed_urls({}, {"KAFKA_OPTS": f"-Xmx1g -D{ALLOWED_URLS}={url},http://a"}) \
        == {url, "http://a"}
    with pytest.raises(SaslConfigError, match="invalid protocol"):
        server_factories({**props, "listener.name.sasl_ssl.oauthbearer.sasl.oauthbearer."
                                   "jwks.endpoint.url": "ftp://x"}, "SASL_SSL")
    with pytest.raises(SaslConfigError, match="JAAS"):
        server_factories({"sasl.enabled.mechanisms": "OAUTHBEARER"}, "SASL_SSL")
    # no JWKS URL and no handler class: Kafka's default, the unsecured validator
    make = server_factories({"sasl.enabled.mechanisms": "OAUTHBEARER", "sasl.jaas.config": JAAS},
                            "SASL_PLAINTEXT")["OAUTHBEARER"]
    now = time.time()
    assert make().evaluate(message(unsecured({"sub": "u", "exp": now + 9}))) == b""
    with pytest.raises(SaslConfigError, match="jwks.endpoint.url"):
        server_factories({"sasl.enabled.mechanisms": "OAUTHBEARER", "sasl.jaas.config": JAAS,
                          "sasl.server.callback.handler.class":
                              "org.apache.kafka.common.security.oauthbearer."
                              "OAuthBearerValidatorCallbackHandler"}, "X")


def test_an_https_jwks_is_trusted_with_the_jaas_configs_ssl_options(tmp_path):
    import ssl
    from tls_support import make_ca
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue("idp")
    body = json.dumps({"keys": [jwk(RSA_KEY, "rsa-1")]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.keystore_pem)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_port}/keys"
    trusting = (f'{JAAS[:-1]} ssl.truststore.type="PEM" '
                f'ssl.truststore.location="{ca.pem}";')
    props = {"sasl.enabled.mechanisms": "OAUTHBEARER", "sasl.jaas.config": trusting,
             "sasl.oauthbearer.jwks.endpoint.url": url, ALLOWED_URLS: url,
             "sasl.oauthbearer.expected.audience": "kafka",
             "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": "300"}
    try:
        make = server_factories(props, "SASL_SSL")["OAUTHBEARER"]
        assert make().evaluate(message(sign())) == b""
        with pytest.raises(SaslConfigError, match="could not fetch the JWKS"):
            server_factories({**props, "sasl.jaas.config": JAAS}, "SASL_SSL")   # untrusted
    finally:
        httpd.shutdown()
