"""Device conformance suite (a package so its file names may repeat those of tests/)."""
