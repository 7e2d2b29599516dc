"""Readers of the store: gate verdicts and their rendering, tables, the HTML report and
its plots. Nothing here imports the backend registry: rows carry what a reader needs."""
