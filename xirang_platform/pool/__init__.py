"""Pool and inventory: the GPU catalog, nodes, interconnect domains and compute units."""
