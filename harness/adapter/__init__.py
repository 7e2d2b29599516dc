"""The adapter contract (public): `Backend`, `Capabilities`, `register` and the registry
dict. It never imports its plug-ins (the `backends` package imports it)."""
