"""fedsv participant: MPI-style ranks that train locally and stream their deltas to the coordinator."""
