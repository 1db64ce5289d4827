"""Drivers: where the engines run: worker processes and Ray (parallel), and the pytest plugin."""
