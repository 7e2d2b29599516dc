"""Result files: rows and their schema (rows), the env fingerprint (env), every output-path
check (paths), the names of files, picked or given (names), row validation for the readers
(validate), merging (merge) and removing rows (remove). Below the runner and the readers (gate, report)."""
