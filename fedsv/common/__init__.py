"""What both sides of a federation share: wire codec and generated code, models, data, training, TLS."""
