"""topocoll: rtp (see ../shared/DESIGN.md)."""
