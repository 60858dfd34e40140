# Empty dependencies file for magi_oracle.
# This may be replaced when dependencies are built.
