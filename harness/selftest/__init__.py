"""`treebench selftest`: the check's own power, measured by mutation testing.

`dense.Dense` is a correct dense PyTorch backend built from small steps (hooks);
`mutants` holds deliberately broken subclasses of it (each overrides one step,
names the coverage axis a check needs to catch it and, for bugs seen in other
projects, the upstream fix); `variants` holds correct re-orderings of the
computation that a check must NOT flag. `power.selftest` runs the default check
on all of them and says which mutants survive.
"""
