"""Person detection and tracking."""
