"""ipywidgets views over viz, scheduling, planning and jobs."""
