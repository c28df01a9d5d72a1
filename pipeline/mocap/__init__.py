"""Motion capture in the pipeline: the run's options, the world step between the engine and the
sinks, the world outputs (JSONL, TRC and NumPy/CSV exports) and the commands (calibrate,
triangulate, export-world). The geometry itself is in stages/mocap."""
