# Empty dependencies file for magi_core.
# This may be replaced when dependencies are built.
