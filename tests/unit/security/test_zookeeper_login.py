"""The brokers' ZooKeeper login (a JAAS file's Client section) and which znodes only the
brokers may read (security/zookeeper_login.py, cluster/zk_security.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_broker.cluster.zk_security import sensitive_path
from trio_broker.config import load_config
from trio_broker.config_errors import ConfigError
from trio_broker.security.zookeeper_login import (
    ZooKeeperLogin,
    client_jaas,
    read_client_login,
    server_jaas,
)

KAFKA_STYLE = """\
KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin" password="admin-secret";
};
Client {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    username="kafka"
    password="zk-secret";
};
"""


def test_the_client_section_of_a_kafka_jaas_file_is_the_login(tmp_path: Path) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(KAFKA_STYLE)
    login = read_client_login(path)
    assert login == ZooKeeperLogin("kafka", "zk-secret")
    assert "zk-secret" not in repr(login)


def test_what_cluster_up_writes_reads_back(tmp_path: Path) -> None:
    login = ZooKeeperLogin("broker", "Abc-123_xyz")
    path = tmp_path / "client.jaas"
    path.write_text(client_jaas(login))
    assert read_client_login(path) == login
    assert 'user_broker="Abc-123_xyz"' in server_jaas([login])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("KafkaServer { x required username=\"a\" password=\"b\"; };", "no Client"),
        ("Client { com.example.Kerberos required username=\"a\" password=\"b\"; };",
         "DigestLoginModule"),
        ("Client { org.apache.zookeeper.server.auth.DigestLoginModule required "
         "username=\"a\"; };", "password"),
    ],
)  # fmt: skip
def test_a_file_without_a_usable_client_section_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_client_login(path)


def test_set_acl_needs_a_login_and_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"zookeeper\.jaas\.file"):
        load_config(zookeeper_connect="127.0.0.1:2181", zookeeper_set_acl=True)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(zookeeper_connect="127.0.0.1:2181", zookeeper_set_acl=True,
                    zookeeper_jaas_file=str(tmp_path / "missing.jaas"))  # fmt: skip
    path = tmp_path / "broker.properties"
    jaas = tmp_path / "client.jaas"
    jaas.write_text(client_jaas(ZooKeeperLogin("broker", "pw")))
    path.write_text(
        f"zookeeper.connect=127.0.0.1:2181\nzookeeper.set.acl=true\nzookeeper.jaas.file={jaas}\n"
    )
    config = load_config(path)
    assert config.zookeeper_set_acl and config.zookeeper_jaas_file == str(jaas)


def test_credentials_and_broker_configs_are_the_sensitive_paths() -> None:
    assert sensitive_path("/config/users") and sensitive_path("/config/users/alice")
    assert sensitive_path("/config/brokers/1")
    assert not sensitive_path("/config") and not sensitive_path("/config/topics/t")
    assert not sensitive_path("/config/usersx") and not sensitive_path("/brokers/ids/1")
