"""A stand-in for FlagGems and triton, for the CPU tests of the flaggems backend (README.md)."""
