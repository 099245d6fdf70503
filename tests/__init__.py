"""fedsv's test suite: unit/ (pure logic), runtime/ (real processes and sockets), deploy/ (real tools)."""
