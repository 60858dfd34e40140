# Empty dependencies file for magi_kernels.
# This may be replaced when dependencies are built.
