# Empty dependencies file for magi_mask.
# This may be replaced when dependencies are built.
