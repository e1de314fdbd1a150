"""Kernels compiled on first use (just-in-time) with the machine's C++ compiler, cached per user."""
