"""The hub of the star: runs episodes, gives each its context, micro-batches role turns to model groups."""
