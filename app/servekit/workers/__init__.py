"""``server.workers``: a supervisor and N worker processes behind the same ports, with one
repository state and one set of statistics (see docs/ARCHITECTURE.md, "Several workers")."""
