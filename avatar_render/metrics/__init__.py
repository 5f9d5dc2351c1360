"""Measuring a render: consistency over time (``inspect``), seams, and the pictures of ``bench``."""
