"""One run: the run request (`config.RunConfig`), one (case, backend) pair, memory prediction,
worker isolation, backend loading (the only importer of the `backends` plug-ins), and
the runner over many pairs."""
