"""Surviving the master: the replicated metadata log, snapshots, leader election on etcd."""
