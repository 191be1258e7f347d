"""Several brokers as one cluster: coordination through ZooKeeper ([cluster]).

``zk_layout`` is pure (paths and znode contents, Kafka's ZooKeeper layout); the rest is
Trio shell code that talks to ZooKeeper through kazoo in worker threads. The rules of
replication themselves live in ``trio_broker.replication``. docs/cluster.md has the design.
"""
