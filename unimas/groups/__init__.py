"""Model-group backends: the part of the star that owns weights."""
