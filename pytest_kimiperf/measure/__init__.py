"""Measurement: play a load pattern against a server and time every token; and the probes that
say what a machine is. It measures and never judges.

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
