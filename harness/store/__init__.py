"""Result files: rows and their schema (rows), the env fingerprint (env), every output-path
check (paths), the names of files, picked or given (names), row validation for the readers
(validate), merging (merge), removing rows (remove) and a row torn by a killed writer, set aside before
the next append (torn). Below the runner and the readers (gate, report)."""
