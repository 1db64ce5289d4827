"""The `capsules` command: parse, call capsule_core, render. No logic of its own."""
