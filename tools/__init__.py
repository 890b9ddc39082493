"""Developer tools that generate files the package ships (tools/README.md). Not part of the installed
package; run from the repository root as ``python -m tools.<name>``."""
