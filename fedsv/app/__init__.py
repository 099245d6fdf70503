"""The `fedsv` command and what it runs: launch, demo, report, certs and the paper's studies."""
