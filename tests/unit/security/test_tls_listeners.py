"""Listener configuration (Kafka's keys), TLS contexts and certificate principals."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from trio_broker.config import BrokerConfig, ConfigError, load_config
from trio_broker.security.listeners import resolve_listeners
from trio_broker.security.principal import (
    NoMatchingRule,
    distinguished_name,
    parse_rules,
    principal_for,
)
from trio_broker.server.transport import server_context, tls_contexts


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return path


def test_default_is_one_plaintext_listener() -> None:
    (only,) = resolve_listeners(BrokerConfig())
    assert (only.name, only.protocol, only.host, only.port) == ("PLAINTEXT", "PLAINTEXT",
                                                                "127.0.0.1", 9092)  # fmt: skip
    assert only.advertised is None and not only.uses_tls and not only.uses_sasl


def test_several_listeners_from_toml(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '''
listeners = "PLAINTEXT://0.0.0.0:9092,CLIENT://127.0.0.1:9094,SASL_PLAINTEXT://[::1]:9095"
"advertised.listeners" = "PLAINTEXT://kafka.example:19092,CLIENT://kafka.example:19094"
"listener.security.protocol.map" = "CLIENT:SASL_SSL,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
"sasl.enabled.mechanisms" = "SCRAM-SHA-512"
"ssl.keystore.location" = "/etc/broker/server.pem"
"connections.max.reauth.ms" = 3600000
[listener.name.sasl_plaintext]
"sasl.enabled.mechanisms" = "PLAIN,SCRAM-SHA-256"
"connections.max.reauth.ms" = 0
'''))  # fmt: skip
    plain, client, sasl = resolve_listeners(config)
    assert (config.host, config.port) == ("0.0.0.0", 9092)
    assert (plain.name, plain.protocol, plain.advertised) == ("PLAINTEXT", "PLAINTEXT",
                                                              ("kafka.example", 19092))  # fmt: skip
    assert (client.protocol, client.host, client.port) == ("SASL_SSL", "127.0.0.1", 9094)
    assert client.uses_tls and client.uses_sasl and client.advertised == ("kafka.example", 19094)
    assert client.mechanisms == ["SCRAM-SHA-512"] and client.reauth_ms == 3_600_000
    assert (sasl.host, sasl.port, sasl.advertised) == ("::1", 9095, None)
    assert sasl.mechanisms == ["PLAIN", "SCRAM-SHA-256"] and sasl.reauth_ms == 0


def test_cli_listen_and_advertised_listener_set_the_first_listener(tmp_path: Path) -> None:
    path = write(tmp_path, 'listeners = "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:0"')
    config = load_config(path, host="127.0.0.1", port=0, advertised_host="h", advertised_port=1)
    first, second = resolve_listeners(config)
    assert (first.port, first.advertised) == (0, ("h", 1))
    assert (second.protocol, second.advertised) == ("SASL_PLAINTEXT", None)


def test_an_inter_broker_listener_of_its_own(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """
listeners = "PLAINTEXT://127.0.0.1:9092,REPLICATION://127.0.0.1:19092"
"listener.security.protocol.map" = "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT"
"advertised.listeners" = "PLAINTEXT://127.0.0.1:9092,REPLICATION://127.0.0.1:29092"
"inter.broker.listener.name" = "REPLICATION"
""",
        )
    )
    assert config.inter_broker_listener_name == "REPLICATION"
    _, replication = resolve_listeners(config)
    assert (replication.protocol, replication.advertised) == ("PLAINTEXT", ("127.0.0.1", 29092))


def test_a_bare_address_still_means_plaintext(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, 'listeners = "127.0.0.1:9999"'))
    (only,) = resolve_listeners(config)
    assert (only.name, only.protocol, only.port) == ("PLAINTEXT", "PLAINTEXT", 9999)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('listeners = "CLIENT://127.0.0.1:1"', "listener.security.protocol.map"),
        ('listeners = "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2"', "twice"),
        ('listeners = "SSL://127.0.0.1:1"', "ssl.keystore.location"),
        ('listeners = "SASL_PLAINTEXT://h:1"\n"sasl.enabled.mechanisms" = "GSSAPI"',
         "sasl.enabled.mechanisms"),
        ('"listener.security.protocol.map" = "X:TLS"', "listener.security.protocol.map"),
        ('"advertised.listeners" = "OTHER://h:1"', "not in listeners"),
        ('"ssl.client.auth" = "sometimes"', "ssl.client.auth"),
        ('"ssl.keystore.type" = "JKS"', "only PEM"),
        ('"ssl.enabled.protocols" = "TLSv1.1"', "ssl.enabled.protocols"),
        ('"ssl.cipher.suite" = "x"', "unknown config key 'ssl.cipher.suite' .did you mean 'ssl.cipher.suites'"),
        ('"listener.name.x.ssl.bogus" = "x"', "unknown config key"),
        ('listeners = "SSL://h:1"\n"ssl.keystore.location" = "k"\n"ssl.client.auth" = "required"',
         "truststore"),
        ('"inter.broker.listener.name" = "REPLICATION"', "REPLICATION is not in listeners"),
        ('listeners = "PLAINTEXT://h:1,SASL_PLAINTEXT://h:2"\n"zookeeper.connect" = "z:1"\n'
         '"inter.broker.listener.name" = "SASL_PLAINTEXT"',
         "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"),
        ('listeners = "SASL_PLAINTEXT://h:2"\n"zookeeper.connect" = "z:1"\n'
         '"sasl.mechanism.inter.broker.protocol" = "PLAIN"',
         "PLAIN: not enabled on the inter-broker listener"),
        ('listeners = "SASL_PLAINTEXT://h:2"\n"zookeeper.connect" = "z:1"\n'
         '"sasl.jaas.config" = "x required username=\\"b\\";"', "password"),
    ],
)  # fmt: skip
def test_bad_listener_configs_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, toml))


# --------------------------------------------------------------------------- TLS contexts


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def test_inline_pem_and_client_auth(tmp_path: Path, ca: trustme.CA) -> None:
    server = ca.issue_cert("127.0.0.1")
    config = BrokerConfig(listeners="SSL://127.0.0.1:0", port=0, security={
        "ssl.keystore.certificate.chain": b"".join(
            blob.bytes() for blob in server.cert_chain_pems).decode(),
        "ssl.keystore.key": server.private_key_pem.bytes().decode(),
        "ssl.truststore.certificates": ca.cert_pem.bytes().decode(),
        "ssl.client.auth": "requested", "ssl.enabled.protocols": "TLSv1.3",
    }).validate()  # fmt: skip
    (listener,) = resolve_listeners(config)
    context = server_context(listener)
    assert context.verify_mode == ssl.CERT_OPTIONAL
    assert context.minimum_version == context.maximum_version == ssl.TLSVersion.TLSv1_3


def test_unreadable_keystore_fails_at_start(tmp_path: Path) -> None:
    config = BrokerConfig(listeners="SSL://127.0.0.1:0", port=0,
                          security={"ssl.keystore.location": str(tmp_path / "missing.pem")})  # fmt: skip
    with pytest.raises(OSError, match="listener SSL: cannot set up TLS"):
        tls_contexts(resolve_listeners(config))


# --------------------------------------------------------------------------- principals

PEER = {"subject": ((("countryName", "DE"),), (("organizationName", "Example, Inc."),),
                    (("organizationalUnitName", "eng"),), (("commonName", "alice"),))}  # fmt: skip


def test_default_principal_is_the_rfc2253_subject() -> None:
    assert distinguished_name(PEER) == r"CN=alice,OU=eng,O=Example\, Inc.,C=DE"
    assert (
        principal_for(PEER, parse_rules("DEFAULT")) == r"User:CN=alice,OU=eng,O=Example\, Inc.,C=DE"
    )
    assert principal_for({}, parse_rules("DEFAULT")) is None
    assert principal_for(None, parse_rules("DEFAULT")) is None


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ("RULE:^CN=([^,]+),.*$/$1/", "User:alice"),
        ("RULE:^CN=([^,]+),OU=([^,]+),.*$/$1@$2/U", "User:ALICE@ENG"),
        ("RULE:^CN=bob,.*$/bob/, RULE:^CN=(.*?),.*$/$1-x/L, DEFAULT", "User:alice-x"),
        ("RULE:^CN=bob,.*$/bob/,DEFAULT", r"User:CN=alice,OU=eng,O=Example\, Inc.,C=DE"),
        (r"RULE:^CN=(\w+),.*$/users\/$1/", "User:users/alice"),
    ],
)
def test_principal_mapping_rules(rules: str, expected: str) -> None:
    assert principal_for(PEER, parse_rules(rules)) == expected


def test_no_matching_rule_refuses() -> None:
    with pytest.raises(NoMatchingRule):
        principal_for(PEER, parse_rules("RULE:^CN=bob,.*$/bob/"))


@pytest.mark.parametrize("rules", ["RULE:^CN=.*$", "RULE:x/y", "NONSENSE"])
def test_bad_mapping_rules(rules: str) -> None:
    with pytest.raises(ValueError, match=r"ssl\.principal\.mapping\.rules"):
        parse_rules(rules)


def test_the_documented_config_loads(tmp_path: Path, ca: trustme.CA) -> None:
    """docs/security.md's complete broker.toml, with its certificate paths made real."""
    doc = (Path(__file__).parents[3] / "docs" / "security.md").read_text()
    toml = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem")
    )
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    toml = toml.replace("/etc/trio-broker/", f"{tmp_path}/")
    config = load_config(write(tmp_path, toml))
    listeners = {listener.name: listener for listener in resolve_listeners(config)}
    assert {name: spec.protocol for name, spec in listeners.items()} == {
        "PLAINTEXT": "PLAINTEXT", "SASL_SSL": "SASL_SSL", "MTLS": "SSL",
        "SASL_PLAINTEXT": "SASL_PLAINTEXT",
    }  # fmt: skip
    assert listeners["MTLS"].settings["ssl.client.auth"] == "required"
    assert listeners["SASL_SSL"].settings["ssl.client.auth"] == "none"
    assert listeners["SASL_PLAINTEXT"].mechanisms == ["SCRAM-SHA-512", "PLAIN"]
    assert listeners["SASL_SSL"].advertised == ("kafka.example.com", 9094)
    assert set(tls_contexts(list(listeners.values()))) == {"SASL_SSL", "MTLS"}
