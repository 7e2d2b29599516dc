"""The `treebench` command line, one module per subcommand (see treebench.harness.cli.main.main)."""
