"""One run: the run request (`RunConfig`), one (case, backend) pair, memory prediction,
worker isolation, backend loading, and the runner over many pairs."""
