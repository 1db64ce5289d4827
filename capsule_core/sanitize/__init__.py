"""The sanitizers of `verify --sanitize`: the emulator under ASan/UBSan, TSan and valgrind, or
compute-sanitizer on a GPU."""
