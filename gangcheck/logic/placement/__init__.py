"""Where a gang fits: quantities, taints, the fit on nodes, topology, reservations, DRA devices."""
