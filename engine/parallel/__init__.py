"""Process groups and collectives: NCCL/gloo groups and the symmetric-memory all-reduces of tensor parallelism."""
