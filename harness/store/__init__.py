"""Result files: rows and their schema, the env fingerprint, row validation, merging,
and every output-path check. Below the runner and the readers (gate, report)."""
