"""Fake NVIDIA command-line tools for simulated driver roots (run through the shims in `<root>/usr/bin`)."""
