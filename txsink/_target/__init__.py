"""Plumbing shared by connectors that write objects or files: epoch manifests, formats.

Private to txsink's own connectors (the API may change between releases); the protocol
never imports it.
"""
