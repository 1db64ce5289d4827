"""Option types shared by several commands (kept import-light: start-up reads this module)."""

from enum import Enum


class BackendOption(str, Enum):
    auto = "auto"
    cuda = "cuda"
    numpy = "numpy"
