"""topocoll: topology (see ../shared/DESIGN.md)."""
