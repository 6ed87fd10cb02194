"""qualify.py's commands (report, probe, gate, health, ready): they import core and tools, never start."""
