"""fedsv.config: settings as command-line flags and checked JSON files, and the checks they share."""
