"""``zookeeper.ssl.*``: what turns TLS to ZooKeeper on, and the errors a bad setting gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from trio_broker.config import load_config
from trio_broker.config_errors import ConfigError
from trio_broker.security.zookeeper_tls import read_tls_config_file, tls_from_properties


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a CA file, a keystore: private key then certificate chain, one PEM file)."""
    directory = tmp_path_factory.mktemp("pems")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("broker")
    keystore = directory / "broker.pem"
    keystore.write_bytes(
        leaf.private_key_pem.bytes() + b"".join(p.bytes() for p in leaf.cert_chain_pems)
    )
    return ca_file, keystore


def test_off_unless_enabled(pems: tuple[Path, Path]) -> None:
    ca, _ = pems
    assert tls_from_properties({}) is None
    assert tls_from_properties({"zookeeper.ssl.truststore.location": str(ca)}) is None
    assert tls_from_properties({"zookeeper.ssl.client.enable": "false"}) is None


def test_enabled_gives_kazoo_a_checked_tls_connection(pems: tuple[Path, Path]) -> None:
    ca, keystore = pems
    tls = tls_from_properties(
        {
            "zookeeper.ssl.client.enable": "true",
            "zookeeper.ssl.keystore.location": str(keystore),
            "zookeeper.ssl.truststore.location": str(ca),
        }
    )
    assert tls is not None
    options = tls.kazoo_options()
    assert options["use_ssl"] and options["verify_certs"] and options["check_hostname"]
    assert options["ca"] == str(ca) and options["certfile"] == options["keyfile"] == str(keystore)
    # Kafka's empty endpoint identification algorithm turns the host name check off.
    unchecked = tls_from_properties(
        {
            "zookeeper.ssl.client.enable": "true",
            "zookeeper.ssl.truststore.location": str(ca),
            "zookeeper.ssl.endpoint.identification.algorithm": "",
        }
    )
    assert unchecked is not None and not unchecked.kazoo_options()["check_hostname"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"zookeeper.ssl.keystore.type": "JKS"}, "zookeeper.ssl.keystore.type: JKS"),
        ({"zookeeper.ssl.truststore.type": "PKCS12"}, "zookeeper.ssl.truststore.type: PKCS12"),
        ({"zookeeper.ssl.keystore.location": "/nonexistent/broker.pem"},
         "zookeeper.ssl.keystore.location: cannot load /nonexistent/broker.pem"),
        ({"zookeeper.ssl.truststore.location": "/nonexistent/ca.pem"},
         "zookeeper.ssl.truststore.location: cannot load /nonexistent/ca.pem"),
        ({"zookeeper.ssl.keystore.location": "/etc/kafka/broker.jks"},
         "looks like a Java keystore"),
        ({"zookeeper.ssl.endpoint.identification.algorithm": "LDAP"},
         "zookeeper.ssl.endpoint.identification.algorithm"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_key(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tls_from_properties({"zookeeper.ssl.client.enable": "true", **extra})


def test_a_keystore_without_its_key_is_refused(pems: tuple[Path, Path]) -> None:
    ca, _ = pems
    with pytest.raises(ConfigError, match="private key and its certificate chain"):
        tls_from_properties(
            {
                "zookeeper.ssl.client.enable": "true",
                "zookeeper.ssl.keystore.location": str(ca),  # certificates only
            }
        )


def test_the_broker_config_fails_at_start_not_at_join(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text(
        "zookeeper.connect=127.0.0.1:2181\n"
        "zookeeper.ssl.client.enable=true\n"
        "zookeeper.ssl.truststore.location=/nonexistent/ca.pem\n"
    )
    with pytest.raises(ConfigError, match=r"zookeeper\.ssl\.truststore\.location"):
        load_config(config)


def test_the_tools_tls_config_file(pems: tuple[Path, Path], tmp_path: Path) -> None:
    ca, keystore = pems
    path = tmp_path / "zk-tls.properties"
    path.write_text(
        "# Kafka's --zk-tls-config-file\n"
        "zookeeper.ssl.client.enable=true\n"
        f"zookeeper.ssl.keystore.location={keystore}\n"
        f"zookeeper.ssl.truststore.location = {ca}\n"
    )
    tls = read_tls_config_file(path)
    assert tls is not None and tls.truststore == str(ca) and tls.keystore == str(keystore)
    with pytest.raises(ConfigError, match="--zk-tls-config-file: cannot read"):
        read_tls_config_file(tmp_path / "missing.properties")
