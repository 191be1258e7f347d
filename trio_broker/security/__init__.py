"""Authentication and authorization.

Authentication (docs/security.md): listeners.py (listener config), transport.py (plain or
TLS connections), sasl.py (the sans-I/O SASL exchange), credentials.py (SCRAM users),
principal.py (TLS certificate principals). Authorization (docs/acls.md): acl.py,
acl_store.py, authorize.py.
"""
