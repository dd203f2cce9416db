"""pytest plugins of the test suite (loaded with -p by the Makefile); each names the private API it uses."""
