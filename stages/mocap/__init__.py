"""Motion capture from several calibrated cameras: the camera model and rig file, association of
persons across views, robust triangulation and ChArUco calibration (plain numpy and OpenCV, on the
CPU; the pipeline's side is pipeline/mocap)."""

# How many views of the board a camera needs for its intrinsics (here, not in charuco.py: the
# command line shows it without importing OpenCV).
DEFAULT_MIN_VIEWS = 8
