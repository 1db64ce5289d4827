"""Placeholder until this family lands."""

SPECS = ()
