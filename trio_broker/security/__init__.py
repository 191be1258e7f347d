"""Authentication and authorization: ACLs (acl.py, acl_store.py, authorize.py)."""
