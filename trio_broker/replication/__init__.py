"""Replication rules, sans-I/O: leader epochs, a leader's view of its followers, follower truncation.

Pure and sync like ``state/``: no trio, no files, no sockets. The Trio shell that will
fetch from leaders and talk to ZooKeeper ([cluster]) drives these objects and performs
what they return. docs/cluster.md describes the design.
"""
