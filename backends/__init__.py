"""Built-in adapters, one module each. Importing this package registers them all
(explicit imports, no discovery by path)."""

from backends import reference  # noqa: F401
