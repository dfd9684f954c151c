"""Simulated operators run by the sandbox's control loop."""
