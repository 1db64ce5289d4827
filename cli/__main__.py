"""`python -m cli ...` from a plain checkout, without an install."""

from cli.app import main

main()
