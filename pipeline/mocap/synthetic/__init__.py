"""Synthetic motion-capture scenes of known truth: cameras, a rendered ChArUco board
(``board``), moving skeletons and what each camera's pose stage would report of them (``people``).
For the ``demo-rig`` command, the tests and the benchmarks."""
