"""Helpers the tests import: closed-form games, process and port helpers, runtime runs, netns hosts."""
