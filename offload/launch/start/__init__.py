"""start.sh's launcher's internals: they import core, tools and start."""
