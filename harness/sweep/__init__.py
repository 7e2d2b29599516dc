"""Many runs: the plan of pairs for an invocation, shards, torchrun ranks and resume."""
