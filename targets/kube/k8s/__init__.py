"""The kubernetes layer (DESIGN.md §2): what rtui applies to a cluster, shared by the kube and aws targets."""
