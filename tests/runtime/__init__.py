"""Runtime tests: a real gRPC coordinator and participant processes on loopback sockets."""
