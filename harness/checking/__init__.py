"""The default check suite of a backend, built from its Capabilities (`treebench check`
without --suite): treebench.harness.checking.default_check."""
