"""The face, shared by both backends, the metrics and doctor: detection, layout and fitting to the frame."""
