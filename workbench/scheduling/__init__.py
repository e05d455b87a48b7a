"""Pipeline schedules as data: generators, passes, validation, timed simulation, memory (pure Python)."""
