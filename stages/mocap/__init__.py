"""Motion capture from several calibrated cameras: the camera model and rig file, association of
persons across views, robust triangulation and ChArUco calibration (plain numpy and OpenCV, on the
CPU; the pipeline's side is pipeline/mocap)."""
