"""fedsv.security: TLS credentials, the run's certificates and tokens, safe logging of network input."""
