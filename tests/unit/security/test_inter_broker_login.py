"""The brokers' own login to each other (security/inter_broker.py): which mechanism and
credentials a secured inter-broker listener implies, and the client side of the SASL
exchanges, checked against a SCRAM server (scramp, the library our listeners use)."""

from __future__ import annotations

import pytest
from scramp import ScramMechanism

from trio_broker.config import BrokerConfig
from trio_broker.config_errors import ConfigError
from trio_broker.security.inter_broker import (
    InterBrokerLogin,
    LoginFailed,
    inter_broker_listener,
    inter_broker_login,
    jaas_credentials,
    sasl_exchange,
)
from trio_broker.security.listeners import resolve_listeners

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="pa\\"ss";'


def login_for(
    security: dict[str, str], listeners: str = "SASL_PLAINTEXT://127.0.0.1:0"
) -> InterBrokerLogin:
    config = BrokerConfig(listeners=listeners, port=0, security=security)
    listener = inter_broker_listener(resolve_listeners(config), None)
    return inter_broker_login(listener, security)


def test_jaas_line_gives_user_and_password() -> None:
    assert jaas_credentials(JAAS, "k") == ("broker", 'pa"ss')
    with pytest.raises(ConfigError, match="password"):
        jaas_credentials('x required username="b";', "k")


def test_mechanism_defaults_to_the_listeners_first_and_credentials_are_per_mechanism() -> None:
    key = "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"
    login = login_for({key: JAAS})
    assert login.tls is None and login.sasl == ("SCRAM-SHA-256", "broker", 'pa"ss')
    chosen = login_for({
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512", "sasl.jaas.config": JAAS,
    })  # fmt: skip
    assert chosen.sasl is not None and chosen.sasl[0] == "SCRAM-SHA-512"
    with pytest.raises(ConfigError, match=key):
        login_for({})
    assert login_for({}, "PLAINTEXT://127.0.0.1:0").sasl is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_logs_in_and_checks_the_servers_proof(mechanism: str) -> None:
    server_side = ScramMechanism(mechanism)
    salt, stored, server_key, iterations = server_side.make_auth_info("secret")

    def run(server_key_seen: bytes) -> None:
        server = server_side.make_server(lambda user: (salt, stored, server_key_seen, iterations))
        tokens = sasl_exchange(mechanism, "broker", "secret")
        server.set_client_first(next(tokens).decode())
        client_final = tokens.send(server.get_server_first().encode())
        server.set_client_final(client_final.decode())
        with pytest.raises(StopIteration):
            tokens.send(server.get_server_final().encode())

    run(server_key)
    # A server that does not know the password cannot prove it: the client refuses it.
    with pytest.raises(LoginFailed, match="signature"):
        run(b"\0" * len(server_key))


def test_plain_is_one_token() -> None:
    tokens = sasl_exchange("PLAIN", "broker", "secret")
    assert next(tokens) == b"\0broker\0secret"
    with pytest.raises(StopIteration):
        tokens.send(b"")
