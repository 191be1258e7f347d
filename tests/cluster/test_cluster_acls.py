"""ACLs and SCRAM users a whole cluster enforces: created through one broker, kept in
ZooKeeper, followed by every broker (cluster/security_store.py).

Three ``serve`` processes with one SASL_PLAINTEXT listener (SCRAM-SHA-256) for clients
and replication, and the ACL authorizer with ``super.users=User:admin``. The admin user
is made before any broker starts with ``trio-broker users add --zookeeper``; broker 3's
data dir holds a single-node user, ``carol``, which it copies into ZooKeeper when it
joins. Through broker 1 only, the admin creates user ``alice`` (AlterUserScramCredentials)
and her ACLs (CreateAcls); clients bootstrapped on brokers 2 and 3 then log in as alice,
write where the ACLs allow and are refused elsewhere; DescribeAcls through broker 3
lists the ACLs; after broker 2 is killed with -9 and restarted it enforces them still;
an ACL deleted through broker 2 stops applying at broker 1.

The brokers and the users tool log in to ZooKeeper and set ACLs (``zookeeper.set.acl``):
a ZooKeeper client without the login can read the cluster's layout but neither read the
SCRAM credentials nor change anything.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from tests.cluster.test_cluster_e2e import eventually
from tests.cluster.test_cluster_faults import Cluster, ConfiguredBroker, running
from tests.e2e.conftest import BROKER_EXE, add_scram_user

pytestmark = pytest.mark.timeout(300)

ADMIN, ADMIN_PW = "admin", "admin-secret"
ALICE, ALICE_PW = "alice", "alice-secret"
GRANTED, FORBIDDEN = "granted-orders", "forbidden"
#: The ZooKeeper test's topic (the ACL test creates GRANTED, FORBIDDEN itself).
LOCKED = "locked"
JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="{ADMIN}" password="{ADMIN_PW}";'
)
CONFIG = (
    "listeners=SASL_PLAINTEXT://127.0.0.1:0\n"
    "inter.broker.listener.name=SASL_PLAINTEXT\n"
    "sasl.enabled.mechanisms=SCRAM-SHA-256\n"
    f"listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config={JAAS}\n"
    "authorizer.class.name=acl\n"
    f"super.users=User:{ADMIN}\n"
    "default.replication.factor=3\n"
    "min.insync.replicas=2\n"
    "replica.lag.time.max.ms=3000\n"
    "zookeeper.session.timeout.ms=4000\n"
    "offsets.topic.num.partitions=1\n"
)


def sasl(broker: ConfiguredBroker, user: str, password: str) -> dict[str, object]:
    return {
        "bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password,
    }  # fmt: skip


def users_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BROKER_EXE), "users", *args], check=check, timeout=60,
                          capture_output=True, text=True)  # fmt: skip


def produce_one(broker: ConfiguredBroker, user: str, password: str, topic: str) -> str | None:
    """One record from a client bootstrapped on ``broker`` only: None, or the error's name
    (a login refused at ``broker`` shows as an authentication error or a timeout)."""
    errors: list[str] = []
    producer = Producer({**sasl(broker, user, password), "acks": "all",
                         "message.timeout.ms": 8000, "retries": 0})  # fmt: skip
    producer.produce(
        topic, b"x", on_delivery=lambda err, _m: errors.append(err.name() if err else "")
    )
    producer.flush(15)
    return (errors or ["no delivery report"])[0] or None


def produces(broker: ConfiguredBroker, topic: str) -> Callable[[], bool]:
    return lambda: produce_one(broker, ALICE, ALICE_PW, topic) is None


def refused(broker: ConfiguredBroker, topic: str) -> Callable[[], bool]:
    return lambda: produce_one(broker, ALICE, ALICE_PW, topic) == "TOPIC_AUTHORIZATION_FAILED"


def acl(name: str, pattern: ResourcePatternType, op: AclOperation) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, f"User:{ALICE}", "*", op,
                      AclPermissionType.ALLOW)  # fmt: skip


ALL_ACLS = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                            AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip


def create_topics(admin: AdminClient, *names: str) -> None:
    """One partition each, three replicas (the default)."""
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 3, "three brokers")
    # The controller that takes the creation assigns from its own broker list, which may
    # lag the one broker 1 answered with (INVALID_REPLICATION_FACTOR): ask until all exist.
    missing = list(names)

    def created() -> bool:
        for name, future in admin.create_topics([NewTopic(t, 1) for t in missing]).items():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.INVALID_REPLICATION_FACTOR:
                    raise AssertionError(f"{name}: {exc}") from None
                continue
            missing.remove(name)
        return not missing

    eventually(created, f"{', '.join(names)} created")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str, zookeeper_jaas: Path
) -> Iterator[Cluster]:
    """One cluster for the module (a start saved): the ZooKeeper test leaves it alone and
    uses a topic of its own; the ACL test, which kills broker 2, runs last."""
    zookeeper, tmp_path = module_zookeeper, tmp_path_factory.mktemp("acls")
    users_cli("add", "--zookeeper", zookeeper, "--zookeeper-jaas", str(zookeeper_jaas),
              "--user", ADMIN, "--password", ADMIN_PW, "--mechanism", "SCRAM-SHA-256")  # fmt: skip
    config = tmp_path / "broker.properties"
    config.write_text(f"{CONFIG}zookeeper.set.acl=true\nzookeeper.jaas.file={zookeeper_jaas}\n")
    brokers = {
        b: ConfiguredBroker(tmp_path / f"broker{b}", b, zookeeper, config) for b in (1, 2, 3)
    }
    add_scram_user(brokers[3].data_dir, "carol", "carol-secret", ("SCRAM-SHA-256",))
    with running(brokers):
        yield brokers


def test_a_zookeeper_client_without_the_login_can_change_nothing(
    cluster: Cluster, module_zookeeper: str
) -> None:
    """What an unprivileged local process did to a cluster whose znodes were open: read
    the super user's SCRAM keys, add a user, register a broker, delete one's
    registration, take over the controller. Each is now refused (NoAuth); the cluster's
    layout stays readable, as with Kafka's ACLs. Fails on the code before ACLs: every
    write went through. Before the ACL test, on its cluster: a topic of its own."""
    zookeeper = module_zookeeper
    admin = AdminClient(sasl(cluster[1], ADMIN, ADMIN_PW))
    create_topics(admin, LOCKED)
    anonymous = KazooClient(hosts=zookeeper)
    anonymous.start(timeout=30)
    try:
        assert anonymous.get_children("/brokers/ids") == ["1", "2", "3"]  # readable
        attempts: dict[str, Callable[[], object]] = {
            "read the super user's SCRAM credential": lambda: anonymous.get(
                f"/config/users/{ADMIN}"
            ),
            "list the users": lambda: anonymous.get_children("/config/users"),
            "add a user": lambda: anonymous.create("/config/users/mallory", b"{}"),
            "change a user": lambda: anonymous.set(f"/config/users/{ADMIN}", b"{}"),
            "grant an ACL": lambda: anonymous.create("/kafka-acl/Topic/x", b"{}", makepath=True),
            "register a broker": lambda: anonymous.create("/brokers/ids/9", b"{}", ephemeral=True),
            "delete a registration": lambda: anonymous.delete("/brokers/ids/1"),
            "delete the controller": lambda: anonymous.delete("/controller"),
            "add a top-level znode": lambda: anonymous.create("/mallory", b""),
            "change a topic": lambda: anonymous.set(f"/brokers/topics/{LOCKED}", b"{}"),
            "reopen the ACL": lambda: anonymous.set_acls("/brokers/ids", OPEN_ACL_UNSAFE),
        }
        allowed = []
        for what, attempt in attempts.items():
            try:
                attempt()
            except NoAuthError:
                continue
            except Exception as exc:  # a missing znode is no refusal either
                allowed.append(f"{what}: {type(exc).__name__}")
                continue
            allowed.append(what)
        assert allowed == []
    finally:
        anonymous.stop()
        anonymous.close()
    # The users tool without the login is refused too, and says what it needs.
    refused_tool = users_cli("list", "--zookeeper", zookeeper, check=False)
    assert refused_tool.returncode == 2
    assert "--zookeeper-jaas" in refused_tool.stderr


def test_acls_and_users_made_through_one_broker_hold_on_every_broker(
    cluster: Cluster, module_zookeeper: str, zookeeper_jaas: Path
) -> None:
    """Last in the module: it kills broker 2 of the shared cluster."""
    zookeeper = module_zookeeper
    one, two, three = cluster[1], cluster[2], cluster[3]
    admin = AdminClient(sasl(one, ADMIN, ADMIN_PW))
    create_topics(admin, GRANTED, FORBIDDEN)
    # Through broker 1 only: the user and her ACLs.
    upsert = UserScramCredentialUpsertion(
        ALICE, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), ALICE_PW.encode()
    )
    admin.alter_user_scram_credentials([upsert])[ALICE].result(timeout=60)
    granted = [
        acl("granted-", ResourcePatternType.PREFIXED, AclOperation.WRITE),
        acl(FORBIDDEN, ResourcePatternType.LITERAL, AclOperation.DESCRIBE),
    ]
    for future in admin.create_acls(granted).values():
        future.result(timeout=60)
    # Brokers 2 and 3 let her log in and decide as the ACLs say.
    for broker in (two, three):
        eventually(
            produces(broker, GRANTED), f"alice writes {GRANTED} via broker {broker.broker_id}"
        )
        eventually(refused(broker, FORBIDDEN), f"alice refused {FORBIDDEN} via {broker.broker_id}")
    admin_at_three = AdminClient(sasl(three, ADMIN, ADMIN_PW))
    listed = admin_at_three.describe_acls(ALL_ACLS).result(timeout=60)
    assert sorted(map(str, listed)) == sorted(map(str, granted))
    # carol came from broker 3's single-node data dir; she logs in at broker 1 (and may
    # not write: no ACL names her).
    listed_users = users_cli(
        "list", "--zookeeper", zookeeper, "--zookeeper-jaas", str(zookeeper_jaas)
    )
    assert "carol" in listed_users.stdout
    assert (three.data_dir / "scram-credentials.json.migrated").exists()
    # The tool read ZooKeeper; broker 1 learns of her from its own watch (until then her
    # login fails there: an authentication error, not the authorization one).
    eventually(
        lambda: produce_one(one, "carol", "carol-secret", GRANTED) == "TOPIC_AUTHORIZATION_FAILED",
        "carol logs in at broker 1 and is refused the write",
    )

    # Broker 2 killed with -9: once its session is gone it restarts, and still enforces.
    two.kill9()
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 2, "broker 2's session ends")
    two.start()
    eventually(produces(two, GRANTED), "alice writes via the restarted broker 2")
    assert refused(two, FORBIDDEN)()

    # Deleted through broker 2, the WRITE grant stops applying at broker 1.
    write_only = AclBindingFilter(ResourceType.TOPIC, "granted-", ResourcePatternType.PREFIXED,
                                  None, None, AclOperation.WRITE, AclPermissionType.ANY)  # fmt: skip
    admin_at_two = AdminClient(sasl(two, ADMIN, ADMIN_PW))
    [deleted] = admin_at_two.delete_acls([write_only]).values()
    assert [str(b) for b in deleted.result(timeout=60)] == [str(granted[0])]
    eventually(refused(one, GRANTED), "alice refused at broker 1 once the ACL is deleted")
