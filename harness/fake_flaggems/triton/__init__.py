"""Stand-in for triton (see ../README.md): records that it was imported."""

import os

if os.environ.get("FAKE_FLAGGEMS_IMPORT_LOG"):
    with open(os.environ["FAKE_FLAGGEMS_IMPORT_LOG"], "a") as _log:
        _log.write("triton\n")
