"""The trial runner: arms in blocks, pytest sessions and their ranks, the run folder, worlds across nodes."""
