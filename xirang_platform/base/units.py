"""The capacity unit: milli-GPU (1000 = one GPU), so fractions of a GPU are exact integers (DESIGN.md section 3)."""

MILLI_PER_GPU = 1000
