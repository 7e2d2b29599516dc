"""Suite files (TOML). A package only so that a non-editable install ships them
beside `harness/`; treebench.harness.model.suites looks them up as <install root>/suites/NAME.toml."""
