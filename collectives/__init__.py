"""topocoll: collectives (see ../shared/DESIGN.md)."""
