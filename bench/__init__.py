"""topocoll: bench (see ../shared/DESIGN.md)."""
